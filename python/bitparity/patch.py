"""bitparity.patch: a Hugging Face Qwen3 or Qwen3-MoE that computes the contract's bits
(docs/torch-ops.md).

    bitparity.patch(model, "bf16-sm90tc-v2")
    out = model(input_ids, attention_mask=mask)   # out.logits, and the contract's out.logprobs, out.entropy
    (out.logprobs * coefficients).sum().backward()  # every p.grad: the contract's, fp32

Afterwards the model's forward runs bitparity.ops on the CPU reference: each batch row is
one sequence, its tokens where the attention mask is 1 (left or right padding), packed
one after another in the canonical order (SPEC.md §6.3), so its logprobs, entropy and
parameter gradients are `bitparity run`'s whatever the padding. The parameters become
fp32 tensors holding their bf16 values (the contract's weight gradients are fp32).
out.logprobs [B, S-1] holds at column j the logprob of the token after position j, where
both are tokens of the row (out.logprob_mask), 0 elsewhere; out.entropy likewise.

Not yet (issue 55): decoding and chunked prefill through HF's KV cache, packed rows
(position_ids restarting within a row), CUDA tensors, tensor/expert/context parallelism.
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


def _rows(input_ids, attention_mask, position_ids):
    """Each batch row's token positions (a contiguous run where the mask is 1)."""
    B, S = input_ids.shape
    mask = torch.ones(B, S, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
    if mask.shape != (B, S):
        raise ValueError(f"bitparity.patch: attention_mask {list(mask.shape)} is not input_ids' {[B, S]}")
    rows = []
    for b in range(B):
        at = mask[b].nonzero().squeeze(1)
        if len(at) == 0 or int(at[-1] - at[0]) + 1 != len(at):
            raise ValueError(f"bitparity.patch: batch row {b}'s tokens are not one run (padding left or right only)")
        if position_ids is not None and not torch.equal(position_ids[b, at].cpu(), torch.arange(len(at))):
            raise ValueError(f"bitparity.patch: batch row {b}'s position_ids are not 0..{len(at) - 1}: packed rows "
                             "and a KV cache are not supported yet (issue 55)")
        rows.append(at)
    return rows


def _forward(model, cfg, c, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
             **unsupported):
    taken = sorted(k for k, v in unsupported.items() if v is not None and v is not False and k != "return_dict")
    if taken:
        raise TypeError(f"bitparity.patch: the patched forward does not take {taken}")
    if past_key_values is not None or use_cache:
        raise NotImplementedError("bitparity.patch: decoding and chunked prefill through a KV cache are not supported "
                                  "yet (issue 55): run whole sequences, use_cache=False")
    if input_ids.device.type != "cpu":
        raise NotImplementedError(f"bitparity.patch: input on {input_ids.device}: this build runs the CPU reference")
    rows = _rows(input_ids, attention_mask, position_ids)
    tokens = torch.cat([input_ids[b, at] for b, at in enumerate(rows)]).to(torch.int32)
    lengths = [len(at) for at in rows]
    positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in lengths])
    logits = _packed_logits(model, cfg, c, tokens, lengths, positions)

    B, S = input_ids.shape
    batch = torch.cat([torch.full((n,), b) for b, n in enumerate(lengths)])
    column = torch.cat(rows)
    out_logits = torch.zeros(B, S, logits.shape[1], dtype=logits.dtype).index_put((batch, column), logits)
    # Packed row r predicts the next token of its sequence where it has one.
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    predicting = torch.cat([s + torch.arange(n - 1) for s, n in zip(starts.tolist(), lengths)]).long()
    lp, entropy = ops.logprob(logits[predicting], tokens[predicting + 1], c)
    where = (batch[predicting], column[predicting])
    mask = torch.zeros(B, max(S - 1, 0), dtype=torch.bool).index_put(where, torch.tensor(True))
    return SimpleNamespace(logits=out_logits, past_key_values=None, logprob_mask=mask,
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


def _packed_logits(model, cfg, c, tokens, lengths, positions):
    """The model on the packed tokens, op by op as SPEC.md §6 runs it; logits [T, V]."""
    m, D = model.model, cfg.head_dim
    tables = ops.rope_tables(cfg.theta, D, max(lengths))
    x = ops.embedding(tokens, m.embed_tokens.weight, c)
    for i, layer in enumerate(m.layers):
        at = layer.self_attn
        a = ops.rmsnorm(x, layer.input_layernorm.weight, cfg.eps, c)
        q, k, v = ops.qkv(a, at.q_proj.weight, at.k_proj.weight, at.v_proj.weight, c)
        q = ops.rope(ops.rmsnorm(q, at.q_norm.weight, cfg.eps, c, heads=q.shape[1] // D), positions, tables, c)
        k = ops.rope(ops.rmsnorm(k, at.k_norm.weight, cfg.eps, c, heads=k.shape[1] // D), positions, tables, c)
        o = ops.attention(q, k, v, lengths, D, c)
        x = x + ops.linear(o, at.o_proj.weight, c, k_chunks=c.tp_tree_width)  # row-parallel: K in chunks
        a = ops.rmsnorm(x, layer.post_attention_layernorm.weight, cfg.eps, c)
        if cfg.is_moe_layer(i):
            x = x + ops.moe(a, layer.mlp.gate.weight, _experts(layer.mlp), cfg.top_k, cfg.norm_topk_prob, c)
        else:
            mlp = layer.mlp
            x = x + ops.mlp(a, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, c)
    h = ops.rmsnorm(x, m.norm.weight, cfg.eps, c)
    return ops.linear(h, model.lm_head.weight, c, n_chunks=c.tp_tree_width)  # column-parallel: its dgrad in chunks
