"""A Qwen3 / Qwen3-MoE in plain torch with Hugging Face transformers' module names and
call structure (transformers is not in Debian): q/k/v/o projections, per-head q/k
norms, apply_rotary_pos_emb called by name from this module, the MLP's
gate/up/down projections, a MoE block whose router is `mlp.gate`, and the model's
forward(input_ids, attention_mask, position_ids, past_key_values). It takes the
batches engines use: padded (left or right, with an attention mask), packed (one
row whose position_ids restart per sequence) and KV-cache decoding."""

import json
import math
import os
from types import SimpleNamespace

import torch
from torch import nn


class Config(SimpleNamespace):
    def to_dict(self):
        return dict(vars(self))


def _dense(**kw):
    c = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=96, hidden_size=32,
             intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
             max_position_embeddings=256, attention_bias=False)
    c.update(kw)
    return c


def dense_config(**kw):
    return Config(**_dense(**kw))


def moe_config(**kw):
    c = _dense(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=[0],
                     decoder_sparse_step=1)
    c.update(kw)
    return Config(**c)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope(c, pos, dtype):
    """cos and sin of each position, [..., head_dim], computed in float64."""
    D = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    f = pos.to(torch.float64)[..., None] * inv
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Qwen3RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        return self.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class _AllReduce(torch.autograd.Function):
    """A row-parallel layer's partial sums added over the TP group; its backward is the identity."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _GradAllReduce(torch.autograd.Function):
    """Before a column-parallel layer: the identity, whose backward adds the ranks' input gradients."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        torch.distributed.all_reduce(g)
        return g


class Parallel(SimpleNamespace):
    """rank and world of the TP group; fused: qkv_proj and gate_up_proj as vLLM and SGLang name them."""

    def column_input(self, x):
        return _GradAllReduce.apply(x) if self.world > 1 else x

    def row_output(self, y):
        return _AllReduce.apply(y) if self.world > 1 else y


SINGLE = Parallel(rank=0, world=1, fused=False)


class RowParallelLinear(nn.Linear):
    """A row-parallel projection whose output is the whole sum, as vLLM's and Megatron's
    are: the ranks' partial products added inside the module."""

    def __init__(self, n_in, n_out, par):
        super().__init__(n_in, n_out, bias=False)
        self.par = par

    def forward(self, x):
        return self.par.row_output(super().forward(x))


class SiluAndMul(nn.Module):
    def forward(self, gate_up):
        g, u = gate_up.chunk(2, dim=-1)
        return nn.functional.silu(g) * u


class Qwen3Attention(nn.Module):
    def __init__(self, c, layer, par=SINGLE):
        super().__init__()
        self.c, self.layer, self.D, self.par = c, layer, c.head_dim, par
        self.q_dim = c.num_attention_heads * c.head_dim // par.world
        self.kv_dim = c.num_key_value_heads * c.head_dim // par.world
        if par.fused:
            self.qkv_proj = nn.Linear(c.hidden_size, self.q_dim + 2 * self.kv_dim, bias=False)
        else:
            self.q_proj = nn.Linear(c.hidden_size, self.q_dim, bias=False)
            self.k_proj = nn.Linear(c.hidden_size, self.kv_dim, bias=False)
            self.v_proj = nn.Linear(c.hidden_size, self.kv_dim, bias=False)
        self.o_proj = RowParallelLinear(self.q_dim, c.hidden_size, par)
        self.q_norm = Qwen3RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, allowed, cache):
        B, S, _ = x.shape
        x = self.par.column_input(x)
        if self.par.fused:
            q, k, v = self.qkv_proj(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q.view(B, S, -1, self.D)).transpose(1, 2)
        k = self.k_norm(k.view(B, S, -1, self.D)).transpose(1, 2)
        v = v.view(B, S, -1, self.D).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            if len(cache) > self.layer:
                k = torch.cat([cache[self.layer][0], k], dim=2)
                v = torch.cat([cache[self.layer][1], v], dim=2)
                cache[self.layer] = (k, v)
            else:
                cache.append((k, v))
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(2, 3)) / math.sqrt(self.D)
        # The dtype's lowest value, not -inf: a padding row that sees no key stays finite.
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        # fp32 as Hugging Face's eager attention, fp64 where the model is (the tests' row checks)
        o = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, S, -1)), None


class Qwen3MLP(nn.Module):
    def __init__(self, c, inter, par=SINGLE):
        super().__init__()
        self.par = par
        inter //= par.world
        if par.fused:
            self.gate_up_proj = nn.Linear(c.hidden_size, 2 * inter, bias=False)
            self.act_fn = SiluAndMul()
        else:
            self.gate_proj = nn.Linear(c.hidden_size, inter, bias=False)
            self.up_proj = nn.Linear(c.hidden_size, inter, bias=False)
        self.down_proj = RowParallelLinear(inter, c.hidden_size, par)

    def forward(self, x):
        x = self.par.column_input(x)
        if self.par.fused:
            m = self.act_fn(self.gate_up_proj(x))
        else:
            m = nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(m)


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.norm = c.num_experts_per_tok, c.norm_topk_prob
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList([Qwen3MLP(c, c.moe_intermediate_size) for _ in range(c.num_experts)])

    def forward(self, x):
        B, S, H = x.shape
        flat = x.view(-1, H)
        logits = self.gate(flat)
        w, idx = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32)),
                            self.k, dim=-1)
        if self.norm:
            w = w / w.sum(-1, keepdim=True)
        w = w.to(x.dtype)
        out = torch.zeros_like(flat)
        for slot in range(self.k):
            for e, expert in enumerate(self.experts):
                rows = (idx[:, slot] == e).nonzero().squeeze(1)
                if len(rows):
                    out = out.index_add(0, rows, expert(flat[rows]) * w[rows, slot, None])
        return out.view(B, S, H)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, c, layer, par=SINGLE):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Qwen3Attention(c, layer, par)
        self.post_attention_layernorm = Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps)
        moe = getattr(c, "num_experts", 0) and layer not in c.mlp_only_layers
        self.mlp = Qwen3MoeSparseMoeBlock(c) if moe else Qwen3MLP(c, c.intermediate_size, par)

    def forward(self, x, cos, sin, allowed, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed, cache)[0]
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, c, par=SINGLE):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(c, i, par) for i in range(c.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps)


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, c, par=SINGLE):
        super().__init__()
        self.config = c
        self.model = Qwen3Model(c, par)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        B, S = input_ids.shape
        cache = past_key_values if past_key_values is not None else ([] if use_cache else None)
        past = cache[0][0].shape[2] if cache else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, past + S, dtype=torch.long)
        valid = attention_mask.bool()
        absolute = torch.arange(past + S)
        if position_ids is not None and B == 1 and S > 1 and (position_ids[0, 1:] == 0).any():
            segment = (position_ids[0] == 0).cumsum(0)  # packed: attend within a segment
            allowed = (segment[:, None] == segment[None, :]) & (absolute[None, :] <= absolute[:, None])
            allowed = allowed[None]
        else:
            causal = absolute[None, :] <= absolute[past:, None]
            allowed = causal[None] & valid[:, None, :]
            if position_ids is None:
                position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        cos, sin = rope(self.config, position_ids, self.model.embed_tokens.weight.dtype)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, allowed, cache)
        logits = self.lm_head(self.model.norm(x))
        return SimpleNamespace(logits=logits, past_key_values=cache)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    pass


def build(config, dtype=torch.float64, seed=0, par=SINGLE):
    """The model of `seed`'s weights; with `par`, rank par.rank's shard of it (the same
    weights cut as Megatron cuts them, fused where par.fused)."""
    torch.manual_seed(seed)
    moe = config.architectures[0] == "Qwen3MoeForCausalLM"
    cls = Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM
    m = cls(config)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    if par is SINGLE:
        return m.to(dtype)
    shard = cls(config, par)
    shard.load_state_dict(_shard_state(m.state_dict(), par))
    return shard.to(dtype)


def _shard_state(full, par):
    """Rank par.rank's slices: column-parallel rows, row-parallel columns; fused as [q | k | v], [gate | up]."""
    def rows(t):
        n = t.shape[0] // par.world
        return t[par.rank * n:(par.rank + 1) * n]

    def cols(t):
        n = t.shape[1] // par.world
        return t[:, par.rank * n:(par.rank + 1) * n]
    out = {}
    for name, t in full.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            out[name] = rows(t)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = cols(t)
        else:
            out[name] = t
    if par.fused:
        for name in list(out):
            if name.endswith("q_proj.weight"):
                base = name[:-len("q_proj.weight")]
                out[base + "qkv_proj.weight"] = torch.cat([out.pop(base + p + ".weight") for p in ("q_proj", "k_proj", "v_proj")])
            if name.endswith("gate_proj.weight"):
                base = name[:-len("gate_proj.weight")]
                out[base + "gate_up_proj.weight"] = torch.cat([out.pop(base + "gate_proj.weight"),
                                                                out.pop(base + "up_proj.weight")])
    return out


def checkpoint_weights(path):
    """A Hugging Face checkpoint's parameters by name, as fp32 master copies of their bf16 values."""
    import bitparity
    index = os.path.join(path, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        tensors, _ = bitparity.read_dump(os.path.join(path, name))
        out.update({k: v.to(torch.bfloat16).float() for k, v in tensors.items()})
    return out


def checkpoint_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def load(path):
    """The checkpoint in this module's torch Qwen3 (bf16), Hugging Face's module names."""
    text = checkpoint_config(path)
    cfg = Config(**text)
    cfg.rope_theta = text["rope_parameters"]["rope_theta"] if "rope_parameters" in text else text["rope_theta"]
    cfg.num_experts = text.get("num_experts", text.get("num_local_experts", 0))
    m = build(cfg, dtype=torch.bfloat16)
    w = checkpoint_weights(path)
    if text.get("tie_word_embeddings"):  # one parameter, as transformers ties them
        m.lm_head.weight = m.model.embed_tokens.weight
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    m.load_state_dict(w)
    return m


def padded_batch(seqs, coefs):
    """Sequences as one batch, right-aligned (the shorter rows left-padded): input_ids, the
    attention mask, and the loss's coefficients at each column's next-token logprob."""
    S = max(len(s) for s in seqs)
    ids, mask, coef = torch.zeros(len(seqs), S, dtype=torch.long), torch.zeros(len(seqs), S, dtype=torch.long), \
        torch.zeros(len(seqs), S - 1)
    for b, (seq, cs) in enumerate(zip(seqs, coefs)):
        pad = S - len(seq)
        ids[b, pad:], mask[b, pad:], coef[b, pad:] = torch.tensor(seq), 1, torch.tensor(cs)
    return ids, mask, coef


def stack_experts(m):
    """transformers 5's layout of each MoE layer's experts: gate_up_proj [E, 2I, H] (an
    expert's gate rows first) and down_proj [E, H, I], parameters of one module."""
    for layer in m.model.layers:
        ex = getattr(layer.mlp, "experts", None)
        if isinstance(ex, torch.nn.ModuleList):
            stacked = torch.nn.Module()
            stacked.gate_up_proj = torch.nn.Parameter(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight])
                                                                   for e in ex]))
            stacked.down_proj = torch.nn.Parameter(torch.stack([e.down_proj.weight for e in ex]))
            layer.mlp.experts = stacked
    return m
