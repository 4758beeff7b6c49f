"""bitparity.patch: a Hugging Face Qwen3 or Qwen3-MoE that computes the contract's bits
(docs/torch-ops.md).

    bitparity.patch(model, "bf16-sm90tc-v3")
    out = model(input_ids, attention_mask=mask)   # out.logits, and the contract's out.logprobs, out.entropy
    (out.logprobs * coefficients).sum().backward()  # every p.grad: the contract's, fp32

Afterwards the model's forward runs bitparity.ops where the model is (the CPU reference,
or optimized/cuda's kernels on a CUDA model, the same bits): each batch row is
one sequence, its tokens where the attention mask is 1 (left or right padding), or several
packed in the row where position_ids restart at 0; the sequences run one after another in
the canonical order (SPEC.md §6.3), so the logprobs, entropy and parameter gradients are
`bitparity run`'s whatever the padding or packing. The parameters become
fp32 tensors holding their bf16 values (the contract's weight gradients are fp32).
out.logprobs [B, S-1] holds at column j the logprob of the token after position j, where
both are tokens of the row (out.logprob_mask), 0 elsewhere; out.entropy likewise.

With use_cache=True the call returns its own cache (bitparity.patch.Cache) as
past_key_values; passing it back continues each batch row's sequence (chunked prefill,
decoding one token a step), under torch.no_grad(): the contract makes those paths the
same bits as one whole-sequence call (SPEC.md §6.2), and its backward runs whole
sequences. The logprob of a token the engine samples is
bitparity.ops.logprob(out.logits[b, -1:], token, contract).

Hugging Face's own cache (a DynamicCache passed as past_key_values) works too: the patched
model writes its keys and values there in HF's layout, and the attention mask covering the
cached and new columns says which hold each row's tokens (HF's convention).

    bitparity.patch(model, contract, tp_group=group)   # this rank's tensor-parallel share

cuts a model's parameters to the rank's share of the TP group (shard_tensor_parallel)
and runs bitparity.dist's ops: the logprobs and entropy on every rank and each parameter's
gradient (its slice of the unsharded one) are the unsharded model's bits; out.logits is the
rank's slice of the vocabulary; MoE layers keep their experts whole on every rank (ep 1),
a head tied to the embedding stays whole, and fewer kv heads than ranks are replicated.

    bitparity.patch(model, contract, dp_group=group)   # ranks holding different sequences

runs each rank's sequences (sequence s of the batch on rank s mod P), a MoE layer's
experts shared out over the ranks (shard_experts, dist.expert_parallel_moe), and gives
every parameter the unsharded model's gradient over the whole batch, on every rank (the
token split, dist.token_split_grads): do not all-reduce it again. With cp_group=group
every rank is given the whole batch and runs its zigzag parts of each sequence (out.logprobs
and out.logprob_mask its rows'), attention by dist.context_parallel_attention; with both,
each data-parallel rank's sequences cut over its CP group. tp_group with either or both:
TP within that plane (SPEC.md §7's grid).
"""

import functools

import torch

from . import dist, ops


def patch(model, contract="bf16-sm90tc-v3", tp_group=None, dp_group=None, cp_group=None, zigzag=True):
    """Makes `model` (HF's Qwen3ForCausalLM / Qwen3MoeForCausalLM module tree) compute the
    contract's bits; returns it. With tp_group (a torch.distributed group of more than one
    rank) the model becomes that rank's tensor-parallel share: `shard_tensor_parallel`.
    With dp_group the ranks hold different sequences of one batch (sequence s on rank s mod
    P) and each MoE layer's experts are shared out (`shard_experts`): every parameter's
    gradient is the unsharded model's over the whole batch, on every rank. With cp_group
    every rank is given the whole batch and runs its parts of each sequence (zigzag, or
    contiguous), the experts and gradients as with dp_group; both: each data-parallel
    rank's sequences cut over its CP group. tp_group with either or both: the rank's TP
    share within that plane."""
    c = ops.contract(contract) if isinstance(contract, str) else contract
    cfg = _Config(model.config)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16).float()  # fp32 master copies of the bf16 values
    lay = _Unsharded(c)
    dp = dp_group is not None and torch.distributed.get_world_size(dp_group) > 1
    cp = cp_group is not None and torch.distributed.get_world_size(cp_group) > 1
    if dp and cp:
        lay = _DataContextParallel(c, dp_group, cp_group, zigzag)
    elif dp:
        lay = _DataParallel(c, dp_group)
    elif cp:
        lay = _ContextParallel(c, cp_group, zigzag)
    if isinstance(lay, _DataParallel) and cfg.experts:
        shard_experts(model, cfg, lay)
    if tp_group is not None and torch.distributed.get_world_size(tp_group) > 1:
        plane = lay if isinstance(lay, _DataParallel) else None
        lay = _TensorParallel(c, tp_group, cfg) if plane is None else _Grid(c, tp_group, cfg, plane)
        shard_tensor_parallel(model, cfg, lay)
    model.forward = functools.partial(_forward, model, cfg, lay)
    return model


class _Unsharded:
    """The ops of a process holding the whole model."""

    kv_replicas = 1

    def __init__(self, c):
        self.c = c

    def begin(self, lengths, device):
        """A call's sequences (their lengths, in the packed order) before it runs; the packed
        rows this rank runs (a host index), or None for all of them."""
        return None

    def embedding(self, tokens, weight):
        return ops.embedding(tokens, weight, self.c)

    def norm(self, x, weight, eps, heads=1):
        return ops.rmsnorm(x, weight, eps, self.c, heads=heads)

    def moe(self, a, mlp, cfg):
        return ops.moe(a, mlp.gate.weight, _experts(mlp), cfg.top_k, cfg.norm_topk_prob, self.c)

    def qkv(self, a, at):
        return ops.qkv(a, at.q_proj.weight, at.k_proj.weight, at.v_proj.weight, self.c)

    def head_norm(self, x, weight, eps, D, replicas=1):
        return self.norm(x, weight, eps, heads=x.shape[1] // D)

    def attention(self, q, k, v, lengths, D):
        return ops.attention(q, k, v, lengths, D, self.c)

    def o_proj(self, o, weight):
        return ops.linear(o, weight, self.c, k_chunks=self.c.tp_tree_width)  # row-parallel: K in chunks

    def mlp(self, a, mlp):
        return ops.mlp(a, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, self.c)

    def head(self, h, weight, rows, targets):
        """(logits [T, V], the rows' logprob and entropy); rows an index or a slice."""
        logits = ops.linear(h, weight, self.c, n_chunks=self.c.tp_tree_width)  # column-parallel: dgrad in chunks
        return (logits, *ops.logprob(logits[rows], targets, self.c))


class _TensorParallel(_Unsharded):
    """Rank t of a TP group (SPEC.md §7): its query and kv heads, its chunks of the MLP's
    intermediate size and of the vocabulary; norms, embeddings and the residual stream
    whole on every rank. Its logits are its vocabulary slice."""

    def __init__(self, c, group, cfg):
        super().__init__(c)
        self.group, self.tp, self.rank = group, torch.distributed.get_world_size(group), \
            torch.distributed.get_rank(group)
        self.intermediate, self.vocab, self.tied = cfg.intermediate, cfg.vocab, False

    def qkv(self, a, at):
        return dist.qkv(a, at.q_proj.weight, at.k_proj.weight, at.v_proj.weight, self.c, self.group,
                        kv_replicas=self.kv_replicas)

    def head_norm(self, x, weight, eps, D, replicas=1):
        return dist.head_norm(x, weight, eps, self.c, x.shape[1] // D, self.group, replicas=replicas)

    def attention(self, q, k, v, lengths, D):
        return dist.attention(q, k, v, lengths, D, self.c, self.group, kv_replicas=self.kv_replicas)

    def o_proj(self, o, weight):
        return dist.row_parallel_linear(o, weight, self.c, self.group)

    def mlp(self, a, mlp):
        return dist.mlp(a, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, self.c, self.group,
                        intermediate=self.intermediate)

    def head(self, h, weight, rows, targets):
        if isinstance(rows, slice):
            rows = torch.arange(rows.start, rows.stop)
        lp, entropy, logits = dist.lm_head_logprob(h, weight, rows, targets, self.c, self.group, vocab=self.vocab,
                                                   return_logits=True, whole=self.tied)
        return logits, lp, entropy


class _DataParallel(_Unsharded):
    """Rank e of a group of P whose ranks hold different sequences of one batch: sequence s
    of the batch on rank s mod P (SPEC.md §7's plane; data parallelism, and expert
    parallelism for MoE layers: rank e holds experts [e·E/P, (e+1)·E/P)). The ops run on
    the rank's rows; every weight gradient is the token split over the whole batch
    (dist.token_split_grads), the same on every rank; MoE layers run
    dist.expert_parallel_moe."""

    def __init__(self, c, group):
        super().__init__(c)
        self.group, self.P, self.rank = group, dist._world(group), dist._rank(group)

    def begin(self, lengths, device):
        self.rows = _batch_rows(lengths, device, self.group).to(device)
        return None

    def split(self, op, inputs, weights, partial=None):
        """op(*inputs, *weights) from the weights' bf16 values, detached, its weights'
        gradients the token split of the op's own over this plane's rows: partial(*inputs,
        *output_grads) of one chunk gives them (default: the op run again on the chunk,
        dist.recomputed, for ops whose backward has collectives of its own)."""
        outs = op(*inputs, *(ops._as_bf16(w, "a weight") for w in weights))
        many = isinstance(outs, tuple)
        wired = dist.token_split_grads(outs if many else (outs,), [x.detach() for x in inputs], weights,
                                       partial or dist.recomputed(op, len(inputs), weights), self.rows, self.c,
                                       self.group)
        return wired if many else wired[0]

    def embedding(self, tokens, weight):
        c, V = self.c, weight.shape[0]
        return self.split(lambda t, w: ops.embedding(t, w, c), [tokens.to(torch.int32)], [weight],
                          lambda t, d: [ops._C.embedding_bwd(t, d, V, c.name)])

    def norm(self, x, weight, eps, heads=1):
        c = self.c

        def partial(x, dy):
            w = ops._as_bf16(weight, "the norm's weight")
            return [ops._C.rmsnorm_bwd(x, w, ops._C.rmsnorm_fwd(x, w, eps, heads, c.name)[1], dy, heads, c.name)[1]]
        return self.split(lambda x, w: ops.rmsnorm(x, w, eps, c, heads=heads), [x], [weight], partial)

    def _linear(self, x, weight, **chunks):
        c = self.c
        return self.split(lambda x, w: ops.linear(x, w, c, **chunks), [x], [weight],
                          lambda x, dy: [ops._C.linear_wgrad(x, dy, c.name)])

    def qkv(self, a, at):
        c = self.c
        return self.split(lambda a, *w: ops.qkv(a, *w, c), [a], (at.q_proj.weight, at.k_proj.weight, at.v_proj.weight),
                          lambda a, *grads: [ops._C.linear_wgrad(a, g, c.name) for g in grads])

    def o_proj(self, o, weight):
        return self._linear(o, weight, k_chunks=self.c.tp_tree_width)

    def mlp(self, a, mlp):
        c, ws = self.c, (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)

        def partial(a, dy):
            return ops._C.mlp_bwd(a, *(ops._as_bf16(w, "an MLP weight") for w in ws), dy, c.name)[1:]
        return self.split(lambda a, *w: ops.mlp(a, *w, c), [a], ws, partial)

    def moe(self, a, mlp, cfg):
        return dist.expert_parallel_moe(a, self.rows, mlp.gate.weight, _experts(mlp), cfg.experts, cfg.top_k,
                                        cfg.norm_topk_prob, self.c, self.group)

    def head(self, h, weight, rows, targets):
        logits = self._linear(h, weight, n_chunks=self.c.tp_tree_width)
        return (logits, *ops.logprob(logits[rows], targets, self.c))


def _batch_rows(lengths, device, group):
    """The rows of a rank's sequences (lengths, in its packed order) in the batch of every
    rank's, sequence s from rank s mod P of `group` (SPEC.md §7), a host index."""
    P, e = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    counts = dist._gather(torch.tensor([len(lengths)], device=device), group).view(-1).tolist()
    total = sum(counts)
    if counts != [len(range(r, total, P)) for r in range(P)]:
        raise ValueError(f"bitparity.patch: the ranks hold {counts} sequences; sequence s of the batch is on "
                         f"rank s mod {P}, so rank e holds ⌈(N - e) / P⌉ of N (SPEC.md §7)")
    held = dist._gather_rows(torch.tensor(lengths, device=device), group)
    ordered = [int(held[s % P][s // P]) for s in range(total)]
    starts = torch.tensor([0] + ordered).cumsum(0).tolist()
    return torch.cat([torch.arange(starts[s], starts[s] + ordered[s]) for s in range(e, total, P)])


def _cp_parts(lengths, rank, P, zigzag):
    """The packed rows of rank's parts of each sequence (SPEC.md §7's cp_owner: zigzag, 2·P
    parts, part i to rank i for i < P and to 2·P − 1 − i after; or P contiguous parts)."""
    n, at, keep = 2 * P if zigzag else P, 0, []
    for S in lengths:
        for i in range(n):
            if (i if i < P else n - 1 - i) == rank:
                keep += range(at + i * S // n, at + (i + 1) * S // n)
        at += S
    return torch.tensor(keep, dtype=torch.long)


class _ContextParallel(_DataParallel):
    """Rank c of a context-parallel group of P: every rank is given the whole batch and runs
    its parts of each sequence (SPEC.md §7's cp_owner: zigzag, 2·P parts, part i to rank i
    for i < P and to 2·P − 1 − i after; or P contiguous parts), its attention by
    dist.context_parallel_attention; weight gradients and MoE layers as under data
    parallelism, over the same group."""

    def __init__(self, c, group, zigzag):
        super().__init__(c, group)
        self.zigzag = zigzag

    def begin(self, lengths, device):
        keep = _cp_parts(lengths, self.rank, self.P, self.zigzag)
        self.rows = self.parts = keep.to(device)
        return keep

    def attention(self, q, k, v, lengths, D):
        return dist.context_parallel_attention(q, k, v, self.parts, lengths, D, self.c, self.cp_group)

    @property
    def cp_group(self):
        return self.group


class _DataContextParallel(_ContextParallel):
    """Rank (e, c) of data parallelism over dp_group and context parallelism over cp_group:
    rank e of dp_group holds sequences s mod |dp| of the batch, and each rank c of its
    cp_group their cp_owner parts. Weight gradients and MoE layers over the plane of all
    (e, c) (the groups as one: dist's (outer, inner) pair), attention over cp_group."""

    def __init__(self, c, dp_group, cp_group, zigzag):
        super().__init__(c, (dp_group, cp_group), zigzag)
        self.dp, self.cp = dp_group, cp_group

    @property
    def cp_group(self):
        return self.cp

    def begin(self, lengths, device):
        whole = _batch_rows(lengths, device, self.dp)  # this data-parallel rank's sequences in the batch
        keep = _cp_parts(lengths, torch.distributed.get_rank(self.cp), torch.distributed.get_world_size(self.cp),
                         self.zigzag)
        self.parts, self.rows = keep.to(device), whole[keep].to(device)
        return keep


class _Grid(_TensorParallel):
    """Rank t of a TP group within a plane of ranks holding different tokens (SPEC.md §7's
    grid: `plane` a _DataParallel or _ContextParallel over the ranks of the same t): the
    tensor-parallel ops on the plane rank's rows, each of their weight gradients (the
    rank's slice) the token split over the plane of the op run again on each chunk with its
    TP peers (dist.recomputed); embedding, norms and MoE layers the plane's."""

    def __init__(self, c, group, cfg, plane):
        super().__init__(c, group, cfg)
        self.plane = plane

    def begin(self, lengths, device):
        return self.plane.begin(lengths, device)

    def _split(self, op, inputs, weights):
        return self.plane.split(op, inputs, weights)  # a TP op: re-run with its peers on each chunk

    def embedding(self, tokens, weight):
        return self.plane.embedding(tokens, weight)

    def norm(self, x, weight, eps, heads=1):
        return self.plane.norm(x, weight, eps, heads)

    def moe(self, a, mlp, cfg):
        return self.plane.moe(a, mlp, cfg)

    def qkv(self, a, at):
        return self._split(lambda a, *w: dist.qkv(a, *w, self.c, self.group, kv_replicas=self.kv_replicas), [a],
                           (at.q_proj.weight, at.k_proj.weight, at.v_proj.weight))

    def head_norm(self, x, weight, eps, D, replicas=1):
        heads = x.shape[1] // D
        return self._split(lambda x, w: dist.head_norm(x, w, eps, self.c, heads, self.group, replicas=replicas), [x],
                           (weight,))

    def attention(self, q, k, v, lengths, D):
        if isinstance(self.plane, _ContextParallel):
            return dist.context_parallel_attention(q, k, v, self.plane.parts, lengths, D, self.c, self.plane.cp_group,
                                                   kv_replicas=self.kv_replicas, tp_group=self.group)
        return super().attention(q, k, v, lengths, D)

    def o_proj(self, o, weight):
        return self._split(lambda o, w: dist.row_parallel_linear(o, w, self.c, self.group), [o], (weight,))

    def mlp(self, a, mlp):
        return self._split(lambda a, *w: dist.mlp(a, *w, self.c, self.group, intermediate=self.intermediate), [a],
                           (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight))

    def head(self, h, weight, rows, targets):
        """The vocabulary-parallel head as an op over token rows (the logprob and entropy of
        the predicting ones, +0 elsewhere), so that its weight gradient splits by rows."""
        n = h.shape[0]
        at = torch.arange(n, device=h.device)[rows] if isinstance(rows, slice) else rows
        predicting = torch.zeros(n, dtype=torch.uint8, device=h.device).index_put(
            (at,), torch.tensor(1, dtype=torch.uint8, device=h.device))
        target = torch.zeros(n, dtype=torch.int32, device=h.device).index_put((at,), targets.to(torch.int32))

        def op(h, predicting, target, w):
            picked = predicting.nonzero().squeeze(1)
            lp, entropy, logits = dist.lm_head_logprob(h, w, picked, target[picked], self.c, self.group,
                                                       vocab=self.vocab, return_logits=True, whole=self.tied)
            zeros = lp.new_zeros(h.shape[0])
            return zeros.index_put((picked,), lp), zeros.index_put((picked,), entropy), logits
        lp, entropy, logits = self._split(op, [h, predicting, target], (weight,))
        return logits, lp[at], entropy[at]


def shard_experts(model, cfg, lay):
    """Cuts each MoE layer's experts to rank `lay.rank`'s E/P of a data/expert-parallel
    group of P (SPEC.md §7): per-expert modules of other experts keep empty weights;
    transformers 5's stacked gate_up_proj and down_proj keep the rank's rows."""
    if cfg.experts % lay.P:
        raise NotImplementedError(f"bitparity.patch: {cfg.experts} experts over {lay.P} ranks: expert parallelism "
                                  "needs P to divide the experts (SPEC.md §7)")
    held = slice(lay.rank * cfg.experts // lay.P, (lay.rank + 1) * cfg.experts // lay.P)
    for i, layer in enumerate(model.model.layers):
        if not cfg.is_moe_layer(i):
            continue
        ex = layer.mlp.experts
        if isinstance(ex, torch.nn.ModuleList):
            for e, expert in enumerate(ex):
                if not held.start <= e < held.stop:
                    for w in (expert.gate_proj.weight, expert.up_proj.weight, expert.down_proj.weight):
                        w.data = w.data[:0]
        else:
            for w in (ex.gate_up_proj, ex.down_proj):
                w.data = w.data[held].contiguous()


def shard_tensor_parallel(model, cfg, lay):
    """Cuts a patched Qwen3's parameters to rank `lay.rank`'s share of a TP group of
    `lay.tp` (SPEC.md §7): q, k, v rows of its heads, o_proj's columns of its query heads,
    gate and up rows and down_proj's columns of its chunks of I, the LM head's rows of its
    chunks of the vocabulary. A MoE layer's router and experts stay whole on every rank
    (each rank its own expert plane: ep 1). Each parameter's gradient is then that slice of
    the unsharded one; a head tied to the embedding stays whole, each rank computing its
    rows, and its gradient is the whole head's plus the embedding's, as unsharded. With
    fewer kv heads than ranks each kv head is held whole by tp / kv_heads consecutive ranks
    (replicated kv heads), its gradient each replica's alike."""
    c, tp, t = lay.c, lay.tp, lay.rank
    m = model.model
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    why = [w for w, bad in (
        (f"{kv_heads} kv heads for {tp} ranks", kv_heads % tp and tp % kv_heads),
        (f"{heads} query heads for {tp} ranks", heads % tp),
        (f"q dim {heads * cfg.head_dim} and kv dim {kv_heads * cfg.head_dim} not multiples of the contract's "
         f"{c.tp_tree_width} chunks", (heads * cfg.head_dim) % c.tp_tree_width or
         (kv_heads * cfg.head_dim) % c.tp_tree_width)) if bad]
    if why:
        raise NotImplementedError(f"bitparity.patch: no tensor-parallel layout of this model here: {why[0]}")

    def cut(param, part, dim):
        param.data = param.data.narrow(dim, part.start, part.stop - part.start).contiguous()

    def share(n):
        return slice(t * n // tp, (t + 1) * n // tp)
    lay.kv_replicas = max(1, tp // kv_heads)
    mine = max(1, kv_heads // tp)  # kv heads a rank holds: its share, or one where replicated
    first = t // lay.kv_replicas * mine
    kv_rows = slice(first * cfg.head_dim, (first + mine) * cfg.head_dim)
    for i, layer in enumerate(m.layers):
        at, mlp = layer.self_attn, layer.mlp
        cut(at.q_proj.weight, share(heads * cfg.head_dim), 0)
        cut(at.o_proj.weight, share(heads * cfg.head_dim), 1)
        for proj in (at.k_proj, at.v_proj):
            cut(proj.weight, kv_rows, 0)
        if cfg.is_moe_layer(i):
            continue
        inter = dist.chunk_slice(cfg.intermediate, c, t, tp)
        cut(mlp.gate_proj.weight, inter, 0)
        cut(mlp.up_proj.weight, inter, 0)
        cut(mlp.down_proj.weight, inter, 1)
    lay.tied = model.lm_head.weight is m.embed_tokens.weight
    if not lay.tied:
        cut(model.lm_head.weight, dist.chunk_slice(cfg.vocab, c, t, tp), 0)


class _Config:
    """The sizes the ops need, from a Hugging Face config (4.x or 5.x spellings)."""

    def __init__(self, config):
        get = functools.partial(getattr, config)
        self.layers = get("num_hidden_layers")
        self.head_dim = get("head_dim", None) or get("hidden_size") // get("num_attention_heads")
        self.eps = get("rms_norm_eps")
        rope = get("rope_parameters", None) or {}
        self.theta = rope.get("rope_theta", None) if isinstance(rope, dict) else None
        self.theta = self.theta or get("rope_theta")
        self.experts = get("num_experts", None) or get("num_local_experts", 0) or 0
        self.top_k = get("num_experts_per_tok", 0)
        self.norm_topk_prob = get("norm_topk_prob", False)
        self.mlp_only = set(get("mlp_only_layers", []) or [])
        self.sparse_step = get("decoder_sparse_step", 1) or 1
        self.intermediate = get("intermediate_size", 0)
        self.vocab = get("vocab_size")

    def rope_tables(self, positions, device):
        """The contract's RoPE tables covering `positions` on `device`, made on the CPU (a
        table of n positions is the first n rows of a longer one) and kept for the next call."""
        have = getattr(self, "_rope", None)
        if have is None or have[0].shape[0] < positions or have[0].device != device:
            n = max(positions, 2 * have[0].shape[0] if have is not None else 0)
            self._rope = tuple(t.to(device) for t in ops.rope_tables(self.theta, self.head_dim, n))
        return self._rope

    def is_moe_layer(self, i):
        return self.experts > 0 and i not in self.mlp_only and (i + 1) % self.sparse_step == 0


class Cache:
    """A patched model's own KV cache: per layer and batch row (sequence), the keys and
    values after RoPE, bf16 [tokens, kv_heads·head_dim], and each sequence's length."""

    def __init__(self, layers, batch):
        self.k = [[None] * batch for _ in range(layers)]
        self.v = [[None] * batch for _ in range(layers)]
        self.length = [0] * batch
        self._lengths = None

    def get_seq_length(self, layer_idx=0):
        return max(self.length)

    def past(self, attention_mask, B, S):
        """Each row's cached tokens."""
        return list(self.length)

    def begin(self, batch, column, lengths, S):
        """This call's tokens: one sequence a row, `lengths` of them, at (batch, column) of S columns."""
        self._lengths = lengths

    def update_layer(self, layer, k, v):
        """Every row's keys and values of `layer` with this call's (packed [T, kv_heads·D])
        appended, packed row after row, and each row's count of them."""
        at = 0
        for b, n in enumerate(self._lengths):
            for store, new in ((self.k, k[at:at + n]), (self.v, v[at:at + n])):
                old = store[layer][b]
                store[layer][b] = new if old is None else torch.cat([old, new])
            at += n
        rows = range(len(self._lengths))
        return (torch.cat([self.k[layer][b] for b in rows]), torch.cat([self.v[layer][b] for b in rows]),
                [self.k[layer][b].shape[0] for b in rows])

    def end(self):
        self.length = [p + n for p, n in zip(self.length, self._lengths)]


class _HfCache:
    """Hugging Face's own cache (a DynamicCache: update(k, v, layer_idx) appends HF's
    [batch, kv_heads, columns, D] and returns the whole) under the patch. It holds the
    patched model's keys and values in HF's layout, padding columns too (zeros where the
    patch writes them); the attention mask over the cached and new columns says which
    columns hold each row's tokens, HF's convention."""

    def __init__(self, cache, D):
        self.cache, self.D = cache, D

    def past(self, attention_mask, B, S):
        P = self.cache.get_seq_length()
        if attention_mask is not None and attention_mask.shape[1] != P + S:
            raise ValueError(f"bitparity.patch: with Hugging Face's cache ({P} columns cached), attention_mask covers "
                             f"the cached and the new columns: [batch, {P + S}], not {list(attention_mask.shape)}")
        full = torch.ones(B, P + S, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
        # Each row's cached and new columns; None where every row has every column (no padding).
        self.columns = None if bool(full.all()) else [row.nonzero().squeeze(1) for row in full]
        return [int(row[:P].sum()) for row in full]

    def begin(self, batch, column, lengths, S):
        self.batch, self.column, self.B, self.S = batch, column, len(lengths), S
        if self.columns is not None:
            self.columns = [c.to(batch.device) for c in self.columns]

    def update_layer(self, layer, k, v):
        hf = []
        for new in (k, v):  # HF's layout: [B, kv_heads, S, D], padding columns zero
            x = new.new_zeros(self.B, self.S, new.shape[1] // self.D, self.D)
            x[self.batch, self.column] = new.view(new.shape[0], -1, self.D)
            hf.append(x.transpose(1, 2))
        K, V = self.cache.update(hf[0], hf[1], layer)
        if self.columns is None:  # one copy of the whole: [B, kv_heads, L, D] -> B rows of [L, kv_heads·D]
            return (*(X.transpose(1, 2).reshape(-1, X.shape[1] * X.shape[3]) for X in (K, V)),
                    [K.shape[2]] * self.B)
        return (*(torch.cat([X[b][:, c].transpose(0, 1).reshape(len(c), -1) for b, c in enumerate(self.columns)])
                  for X in (K, V)), [len(c) for c in self.columns])

    def end(self):
        pass


class Output(dict):
    """The patched forward's result, read as attributes or keys (as transformers' outputs
    are): logits [B, S, V], past_key_values, logprobs, entropy and logprob_mask [B, S-1]."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _sequences(input_ids, attention_mask, position_ids, past):
    """The call's sequences, each (batch row, its new token columns): per row one run where
    the mask is 1 (left or right padding; the mask may cover the cached tokens too, HF's
    convention, its last columns being this call's), cut where position_ids restart at 0
    (sequences packed in one row; not with a cache)."""
    B, S = input_ids.shape
    position_ids = None if position_ids is None else position_ids.cpu()
    mask = torch.ones(B, S, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()[:, -S:]
    if mask.shape != (B, S):
        raise ValueError(f"bitparity.patch: attention_mask {list(attention_mask.shape)} does not end in input_ids' "
                         f"{[B, S]}")
    if position_ids is None and bool(mask.all()):  # every row one sequence on every column
        return [(b, torch.arange(S)) for b in range(B)]
    seqs = []
    for b in range(B):
        at = mask[b].nonzero().squeeze(1)
        if len(at) == 0 or int(at[-1] - at[0]) + 1 != len(at):
            raise ValueError(f"bitparity.patch: batch row {b}'s tokens are not one run (padding left or right only)")
        pos = past[b] + torch.arange(len(at)) if position_ids is None else position_ids[b, at]
        starts = [0] + (pos[1:] == 0).nonzero().squeeze(1).add(1).tolist()  # not a loop: rows of 4096 tokens
        if len(starts) > 1 and past[b]:
            raise ValueError(f"bitparity.patch: batch row {b} packs sequences: not with a KV cache")
        for first, end in zip(starts, starts[1:] + [len(at)]):
            if not torch.equal(pos[first:end], past[b] + torch.arange(end - first)):
                raise ValueError(f"bitparity.patch: batch row {b}'s position_ids from column {int(at[first])} are "
                                 f"not {past[b]}, {past[b] + 1}, ...: each sequence's positions count up from the "
                                 "cache's length (or 0)")
            seqs.append((b, at[first:end]))
    return seqs


def _as_run(index):
    """An increasing host index of rows as a slice where it is one run of consecutive rows
    (the logits' rows read as a view, not gathered: [rows, V] is a gigabyte at 4096 tokens),
    else None."""
    n = len(index)
    if n and int(index[-1] - index[0]) + 1 == n:
        return slice(int(index[0]), int(index[0]) + n)
    return None


def _cache_for(cfg, past_key_values, use_cache, B, D):
    """The call's cache: the one passed back (the patch's own, or Hugging Face's), a new
    one of the patch's own with use_cache, or None."""
    if past_key_values is None:
        return Cache(cfg.layers, B) if use_cache else None
    if isinstance(past_key_values, Cache):
        if len(past_key_values.length) != B:
            raise ValueError(f"bitparity.patch: the cache holds {len(past_key_values.length)} sequences, the batch "
                             f"{B} rows")
        return past_key_values
    if callable(getattr(past_key_values, "update", None)) and callable(getattr(past_key_values, "get_seq_length",
                                                                               None)):
        return _HfCache(past_key_values, D)
    raise TypeError(f"bitparity.patch: past_key_values is a {type(past_key_values).__name__}: pass back the patched "
                    "model's own cache, or one of Hugging Face's (DynamicCache)")


def _forward(model, cfg, lay, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
             cache_position=None, logits_to_keep=0, **unsupported):
    taken = sorted(k for k, v in unsupported.items() if v is not None and v is not False and k != "return_dict")
    if taken:
        raise TypeError(f"bitparity.patch: the patched forward does not take {taken}")
    device = model.lm_head.weight.device
    if input_ids.device != device:
        raise ValueError(f"bitparity.patch: input_ids are on {input_ids.device}, the model on {device}")
    B, S = input_ids.shape
    cache = _cache_for(cfg, past_key_values, use_cache, B, cfg.head_dim)
    if cache is not None and torch.is_grad_enabled():
        raise RuntimeError("bitparity.patch: a KV cache runs under torch.no_grad(): the contract's backward runs "
                           "whole sequences (SPEC.md §6.5)")
    past = cache.past(attention_mask, B, S) if cache is not None else [0] * B
    if cache_position is not None and isinstance(cache, _HfCache):  # else each row's own past says it
        first = cache.cache.get_seq_length()
        if not torch.equal(cache_position.cpu(), first + torch.arange(S)):
            raise ValueError(f"bitparity.patch: cache_position {cache_position.tolist()} is not the cache's next "
                             f"{S} columns from {first}")
    seqs = _sequences(input_ids, attention_mask, position_ids, past)
    # The packing's indices are planned on the host, then moved to the model's device once.
    batch = torch.cat([torch.full((len(at),), b) for b, at in seqs]).to(device)
    column = torch.cat([at for _, at in seqs]).to(device)
    tokens = input_ids[batch, column].to(torch.int32)
    lengths = [len(at) for _, at in seqs]
    positions = torch.cat([past[b] + torch.arange(len(at), dtype=torch.int32) for b, at in seqs]).to(device)
    keep = lay.begin(lengths, device)  # the packed rows this rank runs: all, but under context parallelism
    if cache is not None:  # one sequence a row
        if keep is not None:
            raise ValueError("bitparity.patch: a context-parallel model runs whole sequences, without a cache")
        cache.begin(batch, column, lengths, S)
    # Packed row r predicts the next token of its sequence where this call holds it.
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    predicting = torch.cat([s + torch.arange(n - 1) for s, n in zip(starts.tolist(), lengths)]).long()
    targets = tokens[(predicting + 1).to(device)]
    if keep is not None:  # the rank's rows, and those of them that predict, by their place among them
        held = torch.isin(predicting, keep)
        predicting, targets = torch.searchsorted(keep, predicting[held]), targets[held.to(device)]
        kept = keep.to(device)
        batch, column, tokens, positions = batch[kept], column[kept], tokens[kept], positions[kept]
    rows = _as_run(predicting)
    predicting = predicting.to(device)
    rows = predicting if rows is None else rows
    h = _packed_hidden(model, cfg, lay, tokens, lengths, positions, cache)
    if cache is not None:
        cache.end()
    logits, lp, entropy = lay.head(h, model.lm_head.weight, rows, targets)
    if logits.shape[0] == B * S:  # every column a token of this call, in row-major order: no scatter
        out_logits = logits.view(B, S, -1)
    else:
        out_logits = logits.new_zeros(B, S, logits.shape[1]).index_put((batch, column), logits)
    where = (batch[predicting], column[predicting])
    cols = max(S - 1, 0)
    mask = torch.zeros(B, cols, dtype=torch.bool, device=device).index_put(where, torch.tensor(True, device=device))
    keep = out_logits[:, -logits_to_keep:] if isinstance(logits_to_keep, int) and logits_to_keep > 0 else out_logits
    return Output(logits=keep, past_key_values=past_key_values if isinstance(cache, _HfCache) else cache,
                  logprob_mask=mask, logprobs=lp.new_zeros(B, cols).index_put(where, lp),
                  entropy=entropy.new_zeros(B, cols).index_put(where, entropy))


def _experts(mlp):
    """Each expert's (gate [I, H], up [I, H], down [H, I]) of modules of their own
    (transformers 4.x), or the stacked gate_up_proj [E, 2I, H] (gate rows first) and
    down_proj [E, H, I] (5.x); the experts a rank holds (shard_experts), where it holds some."""
    ex = mlp.experts
    if isinstance(ex, torch.nn.ModuleList):
        return [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in ex if e.gate_proj.weight.numel()]
    return (ex.gate_up_proj, ex.down_proj)  # ops.moe takes them stacked, their gradients stacked too


def _attention(cache, lay, layer, q, k, v, lengths, D):
    """Whole sequences (autograd), or each sequence's new queries after its cached keys."""
    if cache is None:
        return lay.attention(q, k, v, lengths, D)
    keys, values, kv_lengths = cache.update_layer(layer, k, v)
    seqs, q_at, kv_at = [], 0, 0
    for n, kv in zip(lengths, kv_lengths):
        seqs.append((q_at, n, kv - n, kv_at))
        q_at, kv_at = q_at + n, kv_at + kv
    return ops.attention_cached(q, keys, values, seqs, D, lay.c)


def _packed_hidden(model, cfg, lay, tokens, lengths, positions, cache):
    """The model on the packed tokens, op by op as SPEC.md §6 runs it, to the final norm's
    output [T, H]."""
    m, D, c = model.model, cfg.head_dim, lay.c
    tables = cfg.rope_tables(int(positions.max()) + 1, tokens.device)
    x = lay.embedding(tokens, m.embed_tokens.weight)
    for i, layer in enumerate(m.layers):
        at = layer.self_attn
        a = lay.norm(x, layer.input_layernorm.weight, cfg.eps)
        q, k, v = lay.qkv(a, at)
        q = ops.rope(lay.head_norm(q, at.q_norm.weight, cfg.eps, D), positions, tables, c)
        k = ops.rope(lay.head_norm(k, at.k_norm.weight, cfg.eps, D, lay.kv_replicas), positions, tables, c)
        o = _attention(cache, lay, i, q, k, v, lengths, D)
        x = x + lay.o_proj(o, at.o_proj.weight)
        a = lay.norm(x, layer.post_attention_layernorm.weight, cfg.eps)
        x = x + (lay.moe(a, layer.mlp, cfg) if cfg.is_moe_layer(i) else lay.mlp(a, layer.mlp))
    return lay.norm(x, m.norm.weight, cfg.eps)
