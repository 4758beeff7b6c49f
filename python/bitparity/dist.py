"""bitparity.dist: tensor-parallel linears whose bits are the unsharded model's
(docs/torch-ops.md, SPEC.md §7).

A reduction the unsharded op cuts into the contract's C = tp_tree_width fixed chunks
(a row-parallel layer's K, a column-parallel layer's input gradient over N) is shared out
by chunk: rank t of a TP group of size tp holds chunks [t·C/tp, (t+1)·C/tp), a whole
aligned subtree of the pairwise tree (C is a power of two). Each rank computes its
subtree in fp32, the group all-gathers them (never all_reduce: NCCL's and gloo's sums
have their own order), and every rank runs the tree's last levels and rounds once.

    y = bitparity.dist.row_parallel_linear(o_slice, w_o_slice, c, group)   # o_proj
    q, k, v = bitparity.dist.qkv(a, w_q_rows, w_k_rows, w_v_rows, c, group)  # column-parallel
    d = bitparity.dist.mlp(a, w_gate_rows, w_up_rows, w_down_cols, c, group)  # gate/up, then down
    lp, entropy = bitparity.dist.lm_head_logprob(h, w_vocab_rows, rows, targets, c, group)
    q = bitparity.dist.head_norm(q, w_q_norm, eps, c, heads=q_heads_of_rank, group=group)

The vocabulary-parallel head holds rank t's chunks of the vocabulary (chunk_slice says
which rows), and its logprob merges every rank's chunk partials after one all-gather (v2's
chunk states; v1 gathers the chunk maxima, then the sums), as the unsharded op's tree.
`attention` runs a rank's query heads; with replicated kv heads (fewer than ranks, each held
by kv_replicas consecutive ranks) its backward gathers the replicas' query side.
`token_split_wgrad` is a linear's weight gradient over rows the ranks share out in any way
(data, expert or context parallelism), the unsharded bits.
`context_parallel_attention` runs a batch whose sequences' tokens the ranks of a CP group
share out (contiguous or zigzag parts): its keys gathered in the forward, its query side in
the backward.
`expert_parallel_moe` runs the MoE block with the experts shared out over the ranks of an
EP group that hold different tokens.
Built so far: these, on CPU tensors and CUDA ones (the collectives are all_gather alone, so
gloo and NCCL give the same bits).
"""

import torch
import torch.distributed as torch_dist

from . import ops


def _world(group):
    """Ranks in a group, or in a plane given as (outer, inner) groups: their product."""
    if isinstance(group, tuple):
        return _world(group[0]) * _world(group[1])
    return torch_dist.get_world_size(group)


def _rank(group):
    """This rank's place in a group, or in a plane (outer, inner): outer rank · |inner| + inner rank."""
    if isinstance(group, tuple):
        return _rank(group[0]) * _world(group[1]) + _rank(group[1])
    return torch_dist.get_rank(group)


def _gather(t, group):
    """Every rank's t, in rank order, stacked: [tp, ...]; every rank's t has one shape (the
    TP group's ranks hold the same tokens). bf16 travels as its bytes: gloo has no 16-bit
    types, and the bytes are all a gather moves."""
    if t.numel() == 0:  # a decoding step predicts no row of its own: nothing to move (gloo would divide by 0)
        return t.new_empty((_world(group), *t.shape))
    bits = t.contiguous().view(torch.uint8) if t.dtype == torch.bfloat16 else t.contiguous()
    parts = [torch.empty_like(bits) for _ in range(_world(group))]
    torch_dist.all_gather(parts, bits, group=group)
    return torch.stack(parts).view(t.dtype)


def _gather_rows(t, group):
    """Every rank's rows of t (their counts may differ), in rank order: a list of tensors. A
    plane (outer, inner) of two groups gathers over the inner one, then each part over the
    outer one (every rank of the plane in _rank's order)."""
    if isinstance(group, tuple):
        outer, inner = group
        by_inner = [_gather_rows(part, outer) for part in _gather_rows(t, inner)]
        return [by_inner[i][o] for o in range(_world(outer)) for i in range(_world(inner))]
    n = torch.tensor([t.shape[0]], device=t.device)
    counts = [torch.zeros_like(n) for _ in range(_world(group))]
    torch_dist.all_gather(counts, n, group=group)
    most = int(max(counts))
    padded = t.new_zeros((most, *t.shape[1:]))
    padded[:t.shape[0]] = t
    return [p[:int(k)] for p, k in zip(_gather(padded, group), counts)]


def _row_index(rows, t, what):
    """A rank's global row indices as a long tensor on t's device, one for each row of t."""
    rows = torch.as_tensor(rows, device=t.device).long()
    if rows.dim() != 1 or rows.shape[0] != t.shape[0]:
        raise ValueError(f"bitparity.dist: {list(rows.shape)} row indices for {t.shape[0]} {what} rows")
    return rows


def _whole_batch(rows, tensors, group):
    """The whole batch's rows of each tensor, in the canonical order, from every rank's rows
    (global indices `rows`): the ranks' rows must be each of the batch's rows once."""
    all_rows = torch.cat(_gather_rows(rows, group))
    order = torch.argsort(all_rows)
    total = all_rows.shape[0]
    if not torch.equal(all_rows[order], torch.arange(total, device=all_rows.device)):
        raise ValueError(f"bitparity.dist: the ranks' rows are not each of the batch's {total} rows once")
    return [torch.cat(_gather_rows(t, group))[order] for t in tensors]


def _chunks(c, group, what):
    tp = _world(group)
    if c.tp_tree_width % tp:
        raise ValueError(f"bitparity.dist: {what}: a TP group of {tp} does not divide the contract's "
                         f"tp_tree_width {c.tp_tree_width} (SPEC.md §7)")
    return c.tp_tree_width // tp


def _chunk_len(full, c):
    return -(-full // c.tp_tree_width)


def chunk_slice(full, c, rank, tp):
    """Rank `rank`'s elements of a dimension of `full` elements cut into the contract's C
    chunks of ⌈full/C⌉, in a TP group of `tp`: its C/tp chunks (SPEC.md §7; the tail ranks'
    slices shorter), a slice. The vocabulary of the LM head, the MLP's intermediate size."""
    if c.tp_tree_width % tp:
        raise ValueError(f"bitparity.dist: a TP group of {tp} does not divide the contract's tp_tree_width "
                         f"{c.tp_tree_width} (SPEC.md §7)")
    span = c.tp_tree_width // tp * _chunk_len(full, c)
    begin = min(rank * span, full)
    if begin >= full:
        raise ValueError(f"bitparity.dist: rank {rank} of {tp} holds none of {full} elements cut in "
                         f"{c.tp_tree_width} chunks (SPEC.md §7 refuses such a layout)")
    return slice(begin, min(begin + span, full))


class _RowParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, k_full, name, c, group):
        w = ops._as_bf16(weight, "the weight")
        acc = ops._C.linear_acc(x, w, _chunks(c, group, "row_parallel_linear"), _chunk_len(k_full, c), name)
        ctx.save_for_backward(x, w, weight)
        ctx.name = name
        return ops._C.sum_round([ops._C.rank_tree(_gather(acc, group))])

    @staticmethod
    def backward(ctx, dy):
        x, w, weight = ctx.saved_tensors
        # The input gradient reduces over N, which every rank holds whole: local, one chain.
        dx, dw = ops._C.linear_bwd(x, w, dy.contiguous(), 1, ctx.name)
        dweight = ops._weight_grad(weight, dw, "the weight") if ctx.needs_input_grad[1] else None
        return dx, dweight, None, None, None, None


def row_parallel_linear(x, weight, c, group=None, k_full=None):
    """R(x · Wᵀ) of the unsharded K (o_proj, down_proj): x [T, K/tp] and weight [N, K/tp]
    this rank's K slice, its chunks of the unsharded C; the result [T, N] on every rank
    is `ops.linear(x_full, W_full, c, k_chunks=C)`'s bits. k_full defaults to K/tp · tp."""
    ops._ops()
    k_full = int(k_full or x.shape[1] * _world(group))
    return _RowParallel.apply(ops._activation(x, "x"), weight, k_full, ops._name(c), c, group)


class _ColumnParallelQkv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, wq, wk, wv, fulls, replicas, name, c, group):
        ws = [ops._as_bf16(w, f"the {p} weight") for w, p in zip((wq, wk, wv), "qkv")]
        ctx.save_for_backward(a, *ws, wq, wk, wv)
        ctx.fulls, ctx.replicas, ctx.name, ctx.c, ctx.group = fulls, replicas, name, c, group
        return tuple(ops._C.linear_fwd(a, w, 1, name) for w in ws)

    @staticmethod
    def backward(ctx, *grads):
        a, bq, bk, bv, wq, wk, wv = ctx.saved_tensors
        c, group, name, R = ctx.c, ctx.group, ctx.name, ctx.replicas
        local = _chunks(c, group, "qkv")
        trees, dws = [], []
        for i, (g, b, full) in enumerate(zip(grads, (bq, bk, bv), ctx.fulls)):
            g = g.contiguous() if g is not None else a.new_zeros(a.shape[0], b.shape[0])
            dws.append(ops._C.linear_wgrad(a, g, name))
            if i and R > 1:  # a replicated kv head: this replica's 1/R of its features, each chunk once
                share = b.shape[0] // R
                at = torch_dist.get_rank(group) % R * share
                g, b = g[:, at:at + share].contiguous(), b[at:at + share].contiguous()
            acc = ops._C.linear_dgrad_acc(g, b, local, _chunk_len(full, c), name)
            trees.append(ops._C.rank_tree(_gather(acc, group)))
        da = ops._C.sum_round(trees)  # ((0 + q) + k) + v, one rounding: SPEC.md §6.5
        dweights = [ops._weight_grad(w, d, f"the {p} weight") if need else None
                    for w, d, p, need in zip((wq, wk, wv), dws, "qkv", ctx.needs_input_grad[1:4])]
        return (da, *dweights, None, None, None, None, None)


def qkv(a, wq, wk, wv, c, group=None, kv_replicas=1):
    """This rank's q, k, v rows (its heads) of a column-parallel q/k/v projection: a [T, H]
    whole on every rank, each weight this rank's rows, as the unsharded `ops.qkv` cut by
    output features. The input gradient, on every rank, is the unsharded one's bits.
    kv_replicas > 1: fewer kv heads than ranks, each held whole by that many consecutive
    ranks (SPEC.md §7, replicated kv heads); wk and wv are then the rank's kv head's rows."""
    ops._ops()
    tp = _world(group)
    fulls = (int(wq.shape[0]) * tp,) + tuple(int(w.shape[0]) * tp // kv_replicas for w in (wk, wv))
    return _ColumnParallelQkv.apply(ops._activation(a, "a"), wq, wk, wv, fulls, int(kv_replicas), ops._name(c), c,
                                    group)


class _ReplicatedKvAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lengths, D, replicas, name, group):
        o, m, l = ops._C.attention_fwd(q, k, v, lengths, D, name)
        ctx.save_for_backward(q, k, v, o, m, l)
        ctx.lengths, ctx.D, ctx.replicas, ctx.name, ctx.group = lengths, D, replicas, name, group
        return o

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o, m, l = ctx.saved_tensors
        Hq = q.shape[1] // ctx.D
        dq, dk, dv = _attention_bwd_replicated(q, k, v, o, m.view(-1, Hq), l.view(-1, Hq), dout.contiguous(),
                                               ctx.lengths, ctx.D, ctx.name, ctx.group, ctx.replicas)
        return dq, dk, dv, None, None, None, None, None


def _attention_bwd_replicated(q, k, v, o, m, l, dout, lengths, D, name, group, R):
    """The attention backward of this rank's query heads (q, o, dout [T, heads·D]; m, l
    [T, heads]) whose kv head is replicated over R consecutive ranks of `group` (R = 1: not
    replicated): dk and dv reduce over the kv head's whole query group, so the replicas'
    query side is gathered (their heads in order) and the group runs as the unsharded op
    does; (dq of this rank's heads, dk, dv)."""
    if R == 1:
        return ops._C.attention_bwd(q, k, v, o, m.reshape(-1), l.reshape(-1), dout, lengths, D, name)
    first = torch_dist.get_rank(group) // R * R  # the first replica of this rank's kv head

    def whole(t):
        return torch.cat(list(_gather(t.contiguous(), group)[first:first + R]), 1).contiguous()
    dq, dk, dv = ops._C.attention_bwd(whole(q), k, v, whole(o), whole(m).view(-1), whole(l).view(-1), whole(dout),
                                      lengths, D, name)
    mine = torch_dist.get_rank(group) - first
    return dq[:, mine * q.shape[1]:(mine + 1) * q.shape[1]].contiguous(), dk, dv


def attention(q, k, v, lengths, head_dim, c, group=None, kv_replicas=1):
    """Attention of this rank's query heads (whole sequences, as `ops.attention`). With
    kv_replicas > 1 the rank's one kv head is shared by its replicas' heads: its dk and dv
    reduce over the whole query group, so the backward gathers the replicas' query side
    (q, o, dout and the softmax statistics) and runs the group as the unsharded op does;
    dq stays the rank's own heads'."""
    if kv_replicas == 1:
        return ops.attention(q, k, v, lengths, head_dim, c)
    ops._ops()
    return _ReplicatedKvAttention.apply(ops._activation(q, "q"), ops._activation(k, "k"), ops._activation(v, "v"),
                                        [int(n) for n in lengths], int(head_dim), int(kv_replicas), ops._name(c),
                                        group)


def _query_runs(rows, lengths):
    """(q_begin, q_len, past_len, kv_begin) of each run of a rank's rows (global indices,
    increasing, on the host) that are consecutive positions of one sequence of the batch."""
    starts = torch.tensor([0] + lengths).cumsum(0)
    seq = torch.searchsorted(starts, rows, right=True) - 1
    first = torch.ones(len(rows), dtype=torch.bool)
    first[1:] = (rows[1:] != rows[:-1] + 1) | (seq[1:] != seq[:-1])
    begins = first.nonzero().squeeze(1).tolist()
    return [[b, e - b, int(rows[b] - starts[seq[b]]), int(starts[seq[b]])]
            for b, e in zip(begins, begins[1:] + [len(rows)])]


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, lengths, D, name, group, replicas, tp_group):
        K, V = _whole_batch(rows, (k, v), group)  # every sequence's keys, in position order
        if K.shape[0] != sum(lengths):
            raise ValueError(f"bitparity.dist: the ranks hold {K.shape[0]} rows, the sequences {sum(lengths)}")
        o, m, l = ops._C.attention_cached_fwd(q, K, V, _query_runs(rows.cpu(), lengths), D, name)
        ctx.save_for_backward(q, K, V, o, m, l, rows)
        ctx.lengths, ctx.D, ctx.name, ctx.group, ctx.replicas, ctx.tp_group = \
            lengths, D, name, group, replicas, tp_group
        return o

    @staticmethod
    def backward(ctx, dout):
        q, K, V, o, m, l, rows = ctx.saved_tensors
        Hq, T = q.shape[1] // ctx.D, q.shape[0]
        Q, O, M, L, dO = _whole_batch(rows, (q, o, m.view(T, Hq), l.view(T, Hq), dout.contiguous()), ctx.group)
        dq, dk, dv = _attention_bwd_replicated(Q, K, V, O, M, L, dO, ctx.lengths, ctx.D, ctx.name, ctx.tp_group,
                                               ctx.replicas)
        return dq[rows].contiguous(), dk[rows], dv[rows], None, None, None, None, None, None, None


def context_parallel_attention(q, k, v, rows, lengths, head_dim, c, group=None, kv_replicas=1, tp_group=None):
    """Causal attention of a batch whose tokens the ranks of a context-parallel group share
    out in any way (contiguous or zigzag parts of each sequence, SPEC.md §7): this rank holds
    q, k, v of the global rows `rows` (indices into the batch packed in the canonical order,
    increasing), `lengths` the whole batch's sequences. Its output and its q, k, v gradients
    are those rows of the unsharded `ops.attention`'s, bit for bit. Forward: the group
    all-gathers k and v, and each run of the rank's consecutive positions attends keys 0 .. p
    (a query's bits depend on its position and those keys alone, §5.6). Backward: the group
    all-gathers the query side (q, o, dout, m, l) and every rank runs the whole batch's
    backward and keeps its rows: the same bits as SPEC.md's split of query chunks over the
    ranks, at the cost of every rank doing the whole backward. kv_replicas > 1: this rank's
    one kv head is replicated over that many consecutive ranks of tp_group (`attention`'s
    replicated kv heads), so the backward gathers their query side too."""
    ops._ops()
    lengths = [int(n) for n in lengths]
    if any(n < 1 for n in lengths):
        raise ValueError(f"bitparity.dist: sequence lengths {lengths} must be positive")
    rows = _row_index(rows, q, "query")
    return _ContextParallelAttention.apply(ops._activation(q, "q"), ops._activation(k, "k"), ops._activation(v, "v"),
                                           rows, lengths, int(head_dim), ops._name(c), group, int(kv_replicas),
                                           tp_group)


def _from_holders(t, ids, per_rank, group):
    """The whole batch's per-slot rows [T, k, ...] of t, each (token, slot) taken from the
    rank holding its expert (rank r: experts [r·per_rank, (r+1)·per_rank)), where each rank
    computed only its own experts' rows."""
    holder = ids // per_rank
    mine = holder == _rank(group)
    parts = _gather_rows(t[mine], group)
    whole = torch.zeros_like(t)
    for r, part in enumerate(parts):
        whole[holder == r] = part
    return whole


class _ExpertParallelMoe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, rows, router, k, norm, E, name, c, group, stacked, *experts):
        br = ops._as_bf16(router, "the router's weight")
        b = [ops._as_bf16(w, f"the experts' weight {i}") for i, w in enumerate(experts)]
        if stacked:  # gate_up [n, 2I, H] (gate rows first) and down [n, H, I]: each expert's views
            half = b[0].shape[1] // 2
            b = [w for j in range(b[0].shape[0]) for w in (b[0][j, :half], b[0][j, half:], b[1][j])]
        logits, ids, topk_w = ops._C.router_fwd(a, br, k, norm, name)
        A, IDS, W = _whole_batch(rows, (a, ids, topk_w), group)  # the batch's rows, as its experts' holder sees them
        per_rank = E // _world(group)
        first = _rank(group) * per_rank
        C = ops._C.moe_experts_fwd(A, W, IDS, E, first, b[0::3], b[1::3], b[2::3], name)
        C = _from_holders(C, IDS, per_rank, group)
        ctx.save_for_backward(a, rows, br, router, logits, ids, A, IDS, W, *b, *experts)
        ctx.k, ctx.norm, ctx.E, ctx.first, ctx.per_rank, ctx.name, ctx.c, ctx.group, ctx.n, ctx.stacked = \
            k, norm, E, first, per_rank, name, c, group, len(b), stacked
        return ops._C.moe_combine_fwd(C[rows].contiguous())

    @staticmethod
    def backward(ctx, dout):
        a, rows, br, router, logits, ids, A, IDS, W, *rest = ctx.saved_tensors
        b, experts, group = rest[:ctx.n], rest[ctx.n:], ctx.group
        dO, = _whole_batch(rows, (dout.contiguous(),), group)
        da_slot, dtopk_w, *dws = ops._C.moe_experts_bwd(A, W, IDS, ctx.E, ctx.first, b[0::3], b[1::3], b[2::3], dO,
                                                        ctx.name)
        da_slot, dtopk_w = (_from_holders(t, IDS, ctx.per_rank, group)[rows].contiguous() for t in (da_slot, dtopk_w))
        dlogits, da_acc, _ = ops._C.router_bwd(a, br, logits, ids, dtopk_w, ctx.norm, ctx.name)
        da = ops._C.moe_combine_bwd(da_slot, da_acc)
        need = ctx.needs_input_grad
        drouter = ops._weight_grad(router, token_split_wgrad(dlogits, a, rows, ctx.c, group),
                                   "the router's weight") if need[2] else None
        if ctx.stacked:  # each expert's gate and up rows one after the other, as the weight holds them
            dws = [torch.stack([torch.cat(dws[i:i + 2]) for i in range(0, len(dws), 3)]), torch.stack(dws[2::3])]
        dexperts = [ops._weight_grad(w, g, "an expert's weight") if need[10 + i] else None
                    for i, (w, g) in enumerate(zip(experts, dws))]
        return (da, None, drouter, None, None, None, None, None, None, None, *dexperts)


def expert_parallel_moe(a, rows, router, experts, num_experts, k, norm_topk_prob, c, group=None):
    """The Qwen3-MoE block (`ops.moe`) under expert parallelism: the ranks of `group` hold
    different tokens (a [n, H], the global rows `rows` of the batch in its canonical order,
    increasing) and rank r the experts [r·E/P, (r+1)·E/P) (`experts`: each one's gate [I, H],
    up [I, H], down [H, I], or transformers 5's stacked pair gate_up [E/P, 2I, H] and down
    [E/P, H, I], whose gradients then come out stacked); the router whole on every rank.
    The output rows, the input gradient, the held experts' gradients and the router's
    gradient (on every rank) are the unsharded block's bits over the whole batch: each
    (token, slot) row is computed by its expert's holder from that row alone, the holder's
    rows of an expert come in the batch's order (its weight gradient reduces them as the
    unsharded op does), the home rank combines its tokens' slots in order, and the router's
    weight gradient is SPEC.md §7's token split.
    The exchange is an all-gather of the routed rows (every rank receives the batch; an
    all-to-all would move each row to its holder alone: the same bits, less traffic)."""
    ops._ops()
    P, E = _world(group), int(num_experts)
    stacked = len(experts) == 2 and all(torch.is_tensor(w) and w.dim() == 3 for w in experts)
    held = experts[0].shape[0] if stacked else len(experts)
    if E % P or held != E // P:
        raise ValueError(f"bitparity.dist: {E} experts over {P} ranks: each rank holds E/P = {E / P:g} of them "
                         f"(SPEC.md §7: ep divides the experts), this one {held}")
    rows = _row_index(rows, a, "token")
    flat = list(experts) if stacked else [w for e in experts for w in e]
    return _ExpertParallelMoe.apply(ops._activation(a, "a"), rows, router, int(k), bool(norm_topk_prob), E,
                                    ops._name(c), c, group, stacked, *flat)


class _Mlp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, wg, wu, wd, i_full, name, c, group):
        bg, bu, bd = (ops._as_bf16(w, f"the {p} weight") for w, p in zip((wg, wu, wd), ("gate", "up", "down")))
        g, u = ops._C.linear_fwd(a, bg, 1, name), ops._C.linear_fwd(a, bu, 1, name)
        m = ops._C.swiglu_fwd(g, u)
        acc = ops._C.linear_acc(m, bd, _chunks(c, group, "mlp"), _chunk_len(i_full, c), name)
        ctx.save_for_backward(a, bg, bu, bd, g, u, m, wg, wu, wd)
        ctx.i_full, ctx.name, ctx.c, ctx.group = i_full, name, c, group
        return ops._C.sum_round([ops._C.rank_tree(_gather(acc, group))])

    @staticmethod
    def backward(ctx, dy):
        a, bg, bu, bd, g, u, m, wg, wu, wd = ctx.saved_tensors
        c, group, name = ctx.c, ctx.group, ctx.name
        dm, dwd = ops._C.linear_bwd(m, bd, dy.contiguous(), 1, name)  # N = H whole on every rank
        dg, du = ops._C.swiglu_bwd(g, u, dm)
        local, chunk = _chunks(c, group, "mlp"), _chunk_len(ctx.i_full, c)
        trees = [ops._C.rank_tree(_gather(ops._C.linear_dgrad_acc(d, b, local, chunk, name), group))
                 for d, b in ((dg, bg), (du, bu))]
        da = ops._C.sum_round(trees)  # gate's then up's, one rounding: SPEC.md §5.7
        dws = (ops._C.linear_wgrad(a, dg, name), ops._C.linear_wgrad(a, du, name), dwd)
        dweights = [ops._weight_grad(w, d, f"the {p} weight") if need else None
                    for w, d, p, need in zip((wg, wu, wd), dws, ("gate", "up", "down"), ctx.needs_input_grad[1:4])]
        return (da, *dweights, None, None, None, None)


def mlp(a, w_gate, w_up, w_down, c, group=None, intermediate=None):
    """This rank's share of the dense MLP: gate and up rows and down columns of its slice of
    the intermediate size I (its chunks of the unsharded C: `chunk_slice(I, ...)`), a [T, H]
    whole on every rank; the output and the input gradient on every rank are the unsharded
    `ops.mlp`'s bits. intermediate (I) defaults to this rank's rows × tp (exact where C
    divides I)."""
    ops._ops()
    i_full = int(intermediate or w_gate.shape[0] * _world(group))
    return _Mlp.apply(ops._activation(a, "a"), w_gate, w_up, w_down, i_full, ops._name(c), c, group)


class _HeadNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, heads, replicas, name, group):
        w = ops._as_bf16(weight, "the norm's weight")
        out, rstd = ops._C.rmsnorm_fwd(x, w, eps, heads, name)
        ctx.save_for_backward(x, w, rstd, weight)
        ctx.heads, ctx.replicas, ctx.name, ctx.group = heads, replicas, name, group
        return out

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx, _ = ops._C.rmsnorm_bwd(x, w, rstd, dy, ctx.heads, ctx.name)  # per (token, head) row: local
        dweight = None
        if ctx.needs_input_grad[1]:
            # The weight's gradient reduces over every (token, head) row of the unsharded
            # layer in row order: the ranks' heads gathered (one replica of each), then the op.
            def whole(t):
                return torch.cat(list(_gather(t, ctx.group)[::ctx.replicas]), 1).contiguous()
            T, R = x.shape[0], ctx.replicas
            heads = ctx.heads * _world(ctx.group) // R
            _, dw = ops._C.rmsnorm_bwd(whole(x), w, whole(rstd.view(T, ctx.heads)).view(-1), whole(dy), heads,
                                       ctx.name)
            dweight = ops._weight_grad(weight, dw, "the norm's weight")
        return dx, dweight, None, None, None, None, None


def head_norm(x, weight, eps, c, heads, group=None, replicas=1):
    """The per-head RMSNorm of q or k (q_norm, k_norm) on this rank's heads: x [T, heads·D]
    its `heads` heads (rank order is head order), weight [D] whole on every rank. The
    output and x's gradient are per head, local; the weight's gradient, on every rank, is
    the unsharded norm's bits: its (token, head) rows of every rank gathered first.
    `replicas` > 1: each kv head is held by that many consecutive ranks (tp > kv heads,
    SPEC.md §7 replicated kv heads), and the gradient takes one replica of each."""
    ops._ops()
    if _world(group) % replicas:
        raise ValueError(f"bitparity.dist: {replicas} replicas of a head in a TP group of {_world(group)}")
    return _HeadNorm.apply(ops._activation(x, "x"), weight, float(eps), int(heads), int(replicas), ops._name(c),
                           group)


def _chunk_order(g, lo, hi):
    """Columns lo..hi of every rank's gathered partials g [tp, R, width] side by side in rank
    order, [R, tp·(hi − lo)]: the [R, C] of every chunk in order (rank t's j-th chunk is
    chunk t·n + j)."""
    return g[:, :, lo:hi].permute(1, 0, 2).reshape(g.shape[1], g.shape[0] * (hi - lo)).contiguous()


def _from_holder(g, holder, col):
    """Column col of each row from the rank holding its target (the others hold +0 there):
    a selection, not a sum, so a −0 stays −0."""
    return g[holder, torch.arange(g.shape[1], device=g.device), col].contiguous()


def _merged_logprob(sel, targets, span, vocab, c, group, temperature):
    """(logprob, entropy, M, S) of the selected rows over the whole vocabulary, from this
    rank's slice of their logits: SPEC.md §7's stages, the partials gathered and merged as
    the unsharded op merges them."""
    n, L, name = _chunks(c, group, "lm_head_logprob"), _chunk_len(vocab, c), c.name
    begin = torch_dist.get_rank(group) * span
    holder = (targets.long() // span).clamp_max(_world(group) - 1)
    if c.one_pass_logprob:  # v2: one all-gather of every chunk's (m, s, w) and the target's x
        m, s, w, x = ops._C.logprob_slice_states(sel, targets, begin, n, L, temperature, name)
        g = _gather(torch.cat([m, s, w, x[:, None]], 1), group)
        return ops._C.logprob_merge(*(_chunk_order(g, k * n, (k + 1) * n) for k in range(3)),
                                    _from_holder(g, holder, 3 * n), name)
    # v1: the chunk maxima gathered for the row maximum, then the sums against it
    M = ops._C.logprob_row_max(_chunk_order(_gather(ops._C.logprob_slice_max(sel, n, L, temperature, name), group),
                                            0, n), name)
    s, w, x = ops._C.logprob_slice_sums(sel, targets, begin, M, n, L, temperature, name)
    g = _gather(torch.cat([s, w, x[:, None]], 1), group)
    lp, entropy, S = ops._C.logprob_combine(_chunk_order(g, 0, n), _chunk_order(g, n, 2 * n),
                                            _from_holder(g, holder, 2 * n), M, name)
    return lp, entropy, M, S


class _LmHeadLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, rows, targets, vocab, temperature, c, group, whole):
        w = ops._as_bf16(weight, "the LM head's weight")
        span = _chunks(c, group, "lm_head_logprob") * _chunk_len(vocab, c)
        if whole:  # the rank's rows of the whole (tied) weight
            part = chunk_slice(vocab, c, torch_dist.get_rank(group), _world(group))
            w = w[part].contiguous()
        logits = ops._C.linear_fwd(h, w, 1, c.name)
        sel = logits[rows].contiguous()
        lp, entropy, M, S = _merged_logprob(sel, targets, span, vocab, c, group, temperature)
        ctx.save_for_backward(h, w, weight, rows, targets, sel, M, S)
        ctx.span, ctx.vocab, ctx.temperature, ctx.c, ctx.group, ctx.whole = span, vocab, temperature, c, group, whole
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(entropy, logits)
        return lp, entropy, logits

    @staticmethod
    def backward(ctx, dlp, dentropy, dlogits_slice):
        if dlp is None:
            return (None,) * 9
        h, w, weight, rows, targets, sel, M, S = ctx.saved_tensors
        c, group, name = ctx.c, ctx.group, ctx.c.name
        begin = torch_dist.get_rank(group) * ctx.span
        dsel = ops._C.logprob_bwd_slice(sel, targets, begin, dlp.float().contiguous(), M, S, ctx.temperature, name)
        dlogits = dsel.new_zeros(h.shape[0], w.shape[0]).index_put((rows,), dsel)
        # The input gradient reduces over the vocabulary in C chunks: this rank's subtree, then the tree.
        acc = ops._C.linear_dgrad_acc(dlogits, w, _chunks(c, group, "lm_head_logprob"), _chunk_len(ctx.vocab, c),
                                      name)
        dh = ops._C.sum_round([ops._C.rank_tree(_gather(acc, group))])
        dweight = None
        if ctx.needs_input_grad[1]:
            dw = ops._C.linear_wgrad(h, dlogits, name)
            if ctx.whole:  # every rank's rows, in rank order
                dw = torch.cat(_gather_rows(dw, group))
            dweight = ops._weight_grad(weight, dw, "the LM head's weight")
        return dh, dweight, None, None, None, None, None, None, None


def lm_head_logprob(h, weight, rows, targets, c, group=None, vocab=None, temperature=1.0, return_logits=False,
                    whole=False):
    """The vocabulary-parallel LM head and logprob: h [T, H] whole on every rank (the final
    norm's output), weight this rank's rows of the head (`chunk_slice`), rows [R] the token
    rows that predict targets [R]. (logprob, entropy) [R] on every rank are the unsharded
    `ops.logprob(ops.linear(h, W, c, n_chunks=C)[rows], targets, c)`'s bits; the backward
    gives h's gradient (the unsharded bits, on every rank) and this rank's slice of the
    head's. vocab defaults to this rank's rows × tp (exact where C divides V). return_logits:
    also this rank's slice of every row's logits [T, its rows] (no gradient through it).
    whole: weight is the whole head [V, H] (tied to the embedding), of which the rank uses
    its rows; its gradient is then the whole head's, every rank's rows gathered, so that
    autograd adds it to the embedding's as the unsharded tied weight's (one fp32 addition)."""
    ops._ops()
    tp = _world(group)
    vocab = int(vocab or (weight.shape[0] if whole else weight.shape[0] * tp))
    expected = slice(0, vocab) if whole else chunk_slice(vocab, c, torch_dist.get_rank(group), tp)
    if weight.shape[0] != expected.stop - expected.start:
        raise ValueError(f"bitparity.dist: the LM head's slice has {weight.shape[0]} rows, this rank holds "
                         f"{expected.stop - expected.start} of a vocabulary of {vocab} (chunk_slice)")
    rows = torch.as_tensor(rows, device=h.device).long()
    lp, entropy, logits = _LmHeadLogprob.apply(ops._activation(h, "h"), weight, rows, ops._int32(targets, "targets"),
                                               vocab, float(temperature), c, group, bool(whole))
    return (lp, entropy, logits) if return_logits else (lp, entropy)


def token_split_wgrad(dy, x, rows, c, group=None):
    """The weight gradient of a linear, dW = Σ_t dy[t]ᵀ·x[t] fp32 [N, K], over a batch whose
    rows the ranks share out in any way (data, expert or context parallelism): this rank
    holds the global rows `rows` (indices in the canonical order, increasing) with their dy
    [n, N] and x [n, K]. SPEC.md §7's token split: chunk j of grad_token_chunk global rows is
    reduced by rank j mod P from its rows, the chunks' partials gathered and merged by the
    pairwise tree in chunk order. Every rank returns the unsharded `linear_wgrad`'s bits over
    the whole batch. The rows move by an all-gather (every rank receives the batch; an
    all-to-all would move each chunk to its reducer alone: the same bits, less traffic)."""
    ops._ops()
    rows = _row_index(rows, dy, "gradient")
    if rows.shape[0] != x.shape[0]:
        raise ValueError(f"bitparity.dist: {rows.shape[0]} row indices for {x.shape[0]} input rows")
    return _token_split(rows, (x, dy), lambda x, dy: [ops._C.linear_wgrad(x, dy, c.name)],
                        [(dy.shape[1], x.shape[1])], c, group)[0]


def _token_split(rows, tensors, partial, shapes, c, group):
    """Weight gradients of the given `shapes` over a batch whose rows (global indices `rows`)
    the ranks share out: the per-row `tensors` gathered in the canonical order, chunk j of
    grad_token_chunk rows given to partial (the op's own fp32 weight gradients over exactly
    those rows: that chunk's partial) by rank j mod P, the partials gathered and merged by the
    pairwise tree in chunk order, elementwise (SPEC.md §7's token split)."""
    P, me, L = _world(group), _rank(group), c.grad_token_chunk
    whole = _whole_batch(rows, tensors, group)
    chunks = -(-whole[0].shape[0] // L)
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    mine = [torch.cat([g.reshape(-1) for g in partial(*(t[j * L:(j + 1) * L].contiguous() for t in whole))])
            for j in range(me, chunks, P)]
    stacked = torch.stack(mine) if mine else torch.zeros(0, sum(sizes), device=whole[0].device)
    held = _gather_rows(stacked, group)
    tree = ops._C.rank_tree(torch.stack([held[j % P][j // P] for j in range(chunks)]))
    return [g.view(s) for g, s in zip(tree.split(sizes), shapes)]


class _TokenSplitGrads(torch.autograd.Function):
    """Identity on an op's outputs, computed from detached weights; its backward gives those
    weights their gradients by the token split of the op's own per-chunk gradients."""

    @staticmethod
    def forward(ctx, inputs, partial, rows, c, group, n_weights, *weights_and_outputs):
        ctx.inputs, ctx.partial, ctx.rows, ctx.c, ctx.group = inputs, partial, rows, c, group
        ctx.weights = weights_and_outputs[:n_weights]
        return tuple(o.view_as(o) for o in weights_and_outputs[n_weights:])

    @staticmethod
    def backward(ctx, *douts):
        grads = _token_split(ctx.rows, [*ctx.inputs, *(d.contiguous() for d in douts)], ctx.partial,
                             [w.shape for w in ctx.weights], ctx.c, ctx.group)
        dweights = [ops._weight_grad(w, g, "a weight") for w, g in zip(ctx.weights, grads)]
        return (None,) * 6 + tuple(dweights) + douts  # the op's own backward takes the outputs' gradients on


def recomputed(op, n_inputs, weights):
    """A `partial` for token_split_grads from any op(*inputs, *weights): the op run again on
    one chunk's rows from fresh leaves of the weights and its backward taken from the chunk's
    output gradients (an op whose backward has collectives of its own, a tensor-parallel one,
    runs them with its peers, which take the same chunks)."""
    def partial(*chunk):
        fresh = [w.detach().requires_grad_(True) for w in weights]
        with torch.enable_grad():
            outs = op(*chunk[:n_inputs], *fresh)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            pairs = [(o, g) for o, g in zip(outs, chunk[n_inputs:]) if o.requires_grad]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return [f.grad for f in fresh]
    return partial


def token_split_grads(outputs, inputs, weights, partial, rows, c, group=None):
    """The outputs of an op computed from its weights detached (their bf16 values), wired so
    that the weights' gradients are the token split of the op's own: partial(*inputs_chunk,
    *output_grads_chunk) returns the op's fp32 weight gradients over one chunk of rows. For a
    model whose batch rows the ranks share out (data or expert parallelism): each weight's
    gradient on every rank is the unsharded op's over the whole batch."""
    return _TokenSplitGrads.apply(tuple(inputs), partial, rows, c, group, len(weights), *weights, *outputs)
