"""bitparity.patch: a Hugging Face Qwen3 or Qwen3-MoE that computes the contract's bits
(docs/torch-ops.md).

    bitparity.patch(model, "bf16-sm90tc-v2")
    out = model(input_ids, attention_mask=mask)   # out.logits, and the contract's out.logprobs, out.entropy
    (out.logprobs * coefficients).sum().backward()  # every p.grad: the contract's, fp32

Afterwards the model's forward runs bitparity.ops on the CPU reference: each batch row is
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

Not yet (issue 55): HF's own Cache objects (generate()), CUDA tensors,
tensor/expert/context parallelism.
"""

import functools
from types import SimpleNamespace

import torch

from . import ops


def patch(model, contract="bf16-sm90tc-v2"):
    """Makes `model` (HF's Qwen3ForCausalLM / Qwen3MoeForCausalLM module tree) compute the
    contract's bits; returns it."""
    c = ops.contract(contract) if isinstance(contract, str) else contract
    cfg = _Config(model.config)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16).float()  # fp32 master copies of the bf16 values
    model.forward = functools.partial(_forward, model, cfg, c)
    return model


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

    def is_moe_layer(self, i):
        return self.experts > 0 and i not in self.mlp_only and (i + 1) % self.sparse_step == 0


class Cache:
    """A patched model's KV cache: per layer and batch row (sequence), the keys and values
    after RoPE, bf16 [tokens, kv_heads·head_dim], and each sequence's length."""

    def __init__(self, layers, batch):
        self.k = [[None] * batch for _ in range(layers)]
        self.v = [[None] * batch for _ in range(layers)]
        self.length = [0] * batch

    def get_seq_length(self, layer_idx=0):
        return max(self.length)

    def extend(self, layer, b, k, v):
        """Sequence b's keys and values of `layer` with the new ones appended."""
        for store, new in ((self.k, k), (self.v, v)):
            old = store[layer][b]
            store[layer][b] = new if old is None else torch.cat([old, new])
        return self.k[layer][b], self.v[layer][b]


def _sequences(input_ids, attention_mask, position_ids, past):
    """The call's sequences, each (batch row, its new token columns): per row one run where
    the mask is 1 (left or right padding; the mask may cover the cached tokens too, HF's
    convention, its last columns being this call's), cut where position_ids restart at 0
    (sequences packed in one row; not with a cache)."""
    B, S = input_ids.shape
    mask = torch.ones(B, S, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()[:, -S:]
    if mask.shape != (B, S):
        raise ValueError(f"bitparity.patch: attention_mask {list(attention_mask.shape)} does not end in input_ids' "
                         f"{[B, S]}")
    seqs = []
    for b in range(B):
        at = mask[b].nonzero().squeeze(1)
        if len(at) == 0 or int(at[-1] - at[0]) + 1 != len(at):
            raise ValueError(f"bitparity.patch: batch row {b}'s tokens are not one run (padding left or right only)")
        pos = past[b] + torch.arange(len(at)) if position_ids is None else position_ids[b, at].cpu()
        starts = [0] + [j for j in range(1, len(at)) if pos[j] == 0]
        if len(starts) > 1 and past[b]:
            raise ValueError(f"bitparity.patch: batch row {b} packs sequences: not with a KV cache")
        for first, end in zip(starts, starts[1:] + [len(at)]):
            if not torch.equal(pos[first:end], past[b] + torch.arange(end - first)):
                raise ValueError(f"bitparity.patch: batch row {b}'s position_ids from column {int(at[first])} are "
                                 f"not {past[b]}, {past[b] + 1}, ...: each sequence's positions count up from the "
                                 "cache's length (or 0)")
            seqs.append((b, at[first:end]))
    return seqs


def _forward(model, cfg, c, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
             **unsupported):
    taken = sorted(k for k, v in unsupported.items() if v is not None and v is not False and k != "return_dict")
    if taken:
        raise TypeError(f"bitparity.patch: the patched forward does not take {taken}")
    if past_key_values is not None and not isinstance(past_key_values, Cache):
        raise TypeError(f"bitparity.patch: past_key_values is a {type(past_key_values).__name__}: pass back the "
                        "patched model's own (HF's Cache objects are not supported yet, issue 55)")
    if input_ids.device.type != "cpu":
        raise NotImplementedError(f"bitparity.patch: input on {input_ids.device}: this build runs the CPU reference")
    B, S = input_ids.shape
    cache = past_key_values or (Cache(cfg.layers, B) if use_cache else None)
    if cache is not None and torch.is_grad_enabled():
        raise RuntimeError("bitparity.patch: a KV cache runs under torch.no_grad(): the contract's backward runs "
                           "whole sequences (SPEC.md §6.5)")
    if cache is not None and len(cache.length) != B:
        raise ValueError(f"bitparity.patch: the cache holds {len(cache.length)} sequences, the batch {B} rows")
    past = cache.length if cache is not None else [0] * B
    seqs = _sequences(input_ids, attention_mask, position_ids, past)
    tokens = torch.cat([input_ids[b, at] for b, at in seqs]).to(torch.int32)
    lengths = [len(at) for _, at in seqs]
    positions = torch.cat([past[b] + torch.arange(len(at), dtype=torch.int32) for b, at in seqs])
    logits = _packed_logits(model, cfg, c, tokens, lengths, positions, cache)
    if cache is not None:  # one sequence a row
        cache.length = [p + n for p, n in zip(past, lengths)]

    batch = torch.cat([torch.full((len(at),), b) for b, at in seqs])
    column = torch.cat([at for _, at in seqs])
    out_logits = torch.zeros(B, S, logits.shape[1], dtype=logits.dtype).index_put((batch, column), logits)
    # Packed row r predicts the next token of its sequence where this call holds it.
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    predicting = torch.cat([s + torch.arange(n - 1) for s, n in zip(starts.tolist(), lengths)]).long()
    lp, entropy = ops.logprob(logits[predicting], tokens[predicting + 1], c)
    where = (batch[predicting], column[predicting])
    mask = torch.zeros(B, max(S - 1, 0), dtype=torch.bool).index_put(where, torch.tensor(True))
    return SimpleNamespace(logits=out_logits, past_key_values=cache, logprob_mask=mask,
                           logprobs=torch.zeros(B, max(S - 1, 0)).index_put(where, lp),
                           entropy=torch.zeros(B, max(S - 1, 0)).index_put(where, entropy))


def _experts(mlp):
    """Each expert's (gate [I, H], up [I, H], down [H, I]): modules of their own
    (transformers 4.x) or views of the stacked gate_up_proj [E, 2I, H] (gate rows first)
    and down_proj [E, H, I] (5.x)."""
    ex = mlp.experts
    if isinstance(ex, torch.nn.ModuleList):
        return [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in ex]
    I = ex.gate_up_proj.shape[1] // 2
    return [(ex.gate_up_proj[e, :I], ex.gate_up_proj[e, I:], ex.down_proj[e]) for e in range(ex.gate_up_proj.shape[0])]


def _attention(cache, layer, q, k, v, lengths, D, c):
    """Whole sequences (autograd), or each sequence's new queries after its cached keys."""
    if cache is None:
        return ops.attention(q, k, v, lengths, D, c)
    ks, vs, seqs, q_at, kv_at = [], [], [], 0, 0
    for b, n in enumerate(lengths):
        past = cache.length[b]
        kb, vb = cache.extend(layer, b, k[q_at:q_at + n], v[q_at:q_at + n])
        ks.append(kb)
        vs.append(vb)
        seqs.append((q_at, n, past, kv_at))
        q_at, kv_at = q_at + n, kv_at + past + n
    return ops.attention_cached(q, torch.cat(ks), torch.cat(vs), seqs, D, c)


def _packed_logits(model, cfg, c, tokens, lengths, positions, cache):
    """The model on the packed tokens, op by op as SPEC.md §6 runs it; logits [T, V]."""
    m, D = model.model, cfg.head_dim
    tables = ops.rope_tables(cfg.theta, D, int(positions.max()) + 1)
    x = ops.embedding(tokens, m.embed_tokens.weight, c)
    for i, layer in enumerate(m.layers):
        at = layer.self_attn
        a = ops.rmsnorm(x, layer.input_layernorm.weight, cfg.eps, c)
        q, k, v = ops.qkv(a, at.q_proj.weight, at.k_proj.weight, at.v_proj.weight, c)
        q = ops.rope(ops.rmsnorm(q, at.q_norm.weight, cfg.eps, c, heads=q.shape[1] // D), positions, tables, c)
        k = ops.rope(ops.rmsnorm(k, at.k_norm.weight, cfg.eps, c, heads=k.shape[1] // D), positions, tables, c)
        o = _attention(cache, i, q, k, v, lengths, D, c)
        x = x + ops.linear(o, at.o_proj.weight, c, k_chunks=c.tp_tree_width)  # row-parallel: K in chunks
        a = ops.rmsnorm(x, layer.post_attention_layernorm.weight, cfg.eps, c)
        if cfg.is_moe_layer(i):
            x = x + ops.moe(a, layer.mlp.gate.weight, _experts(layer.mlp), cfg.top_k, cfg.norm_topk_prob, c)
        else:
            mlp = layer.mlp
            x = x + ops.mlp(a, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, c)
    h = ops.rmsnorm(x, m.norm.weight, cfg.eps, c)
    return ops.linear(h, model.lm_head.weight, c, n_chunks=c.tp_tree_width)  # column-parallel: its dgrad in chunks
