"""Look-alikes of vLLM's and SGLang's Qwen3 / Qwen3-MoE models in plain torch (neither
engine is installed here), written from their source (docs/python.md names the
commits read): the same module paths, fused parameters, sharding and call
conventions, loaded with a tiny_qwen3 model's weights.

- forward(input_ids [T], positions [T]) of a flat batch mixing sequences (prefill
  chunks and decode tokens); which sequence each token is lives only in the engine's
  attention metadata (Batch), apart from bitparity's rows;
- the linear layers (QKVParallelLinear, MergedColumnParallelLinear: one column-
  parallel class here; RowParallelLinear, all-reduced inside; ReplicatedLinear)
  return (out, bias);
- RMSNorm(x, residual) returns (normed, x + residual), written into x and residual
  in place as the CUDA kernels do (out of place while autograd records, as their
  native path);
- one rotary_emb shared by every layer (get_rope's cache), (q, k) =
  rotary_emb(positions, q, k) of [T, heads·dim], in place;
- q/k norms on a [T, heads, dim] view (vLLM) or [T·heads, dim] (SGLang);
- attn(q, k, v) -> [T, heads·dim] over each sequence's KV cache;
- logits of the sampled rows: vLLM's compute_logits(hidden) after the forward,
  SGLang's LogitsProcessor ending the forward (next_token_logits), both all-gathered
  over the vocabulary-parallel LM head;
- MoE: the router gate (ReplicatedLinear), FusedMoE experts (w13_weight, w2_weight)
  with the top-k inside (vLLM: experts(hidden_states=, router_logits=); SGLang: a
  TopK module, then experts(hidden_states, topk_output)); the block all-reduces the
  experts' partial sums."""

import math
import re
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import bitparity
import tiny_qwen3


def _runs(seqs):
    """(seq, start, stop) of each run of one sequence in a flat call's tokens."""
    runs, start = [], 0
    for k in range(1, len(seqs) + 1):
        if k == len(seqs) or seqs[k] != seqs[start]:
            runs.append((seqs[start], start, k))
            start = k
    return runs


def _in_place(out, *results):
    """The CUDA kernels' in-place write of results into out; while autograd records,
    the native path's new tensors."""
    if torch.is_grad_enabled():
        return results
    for o, r in zip(out, results):
        o.copy_(r)
    return out


def _all_gather(x, par):
    """The ranks' vocabulary slices of the logits side by side (inference only)."""
    if par.world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(par.world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


class _Linear(nn.Module):
    def __init__(self, n_in, n_out, par):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.par = par


class ColumnParallelLinear(_Linear):
    """QKVParallelLinear and MergedColumnParallelLinear: the rank's rows of a fused weight."""

    def forward(self, x):
        return F.linear(self.par.column_input(x), self.weight), None


class RowParallelLinear(_Linear):
    def forward(self, x):
        return self.par.row_output(F.linear(x, self.weight)), None


class ReplicatedLinear(_Linear):
    def forward(self, x):
        return F.linear(x, self.weight), None


class RMSNorm(tiny_qwen3.Qwen3RMSNorm):
    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x)
        total = x + residual
        return _in_place((x, residual), super().forward(total), total)


class RotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, positions, q, k):
        T, D = q.shape[0], self.config.head_dim
        cos, sin = tiny_qwen3.rope(self.config, positions, q.dtype)
        qr, kr = tiny_qwen3.apply_rotary_pos_emb(q.view(T, -1, D), k.view(T, -1, D), cos, sin)
        return _in_place((q, k), qr.reshape(q.shape), kr.reshape(k.shape))


class Attention(nn.Module):
    """vLLM's Attention (its metadata from the forward context: the engine's batch) and
    SGLang's RadixAttention (given forward_batch)."""

    def __init__(self, layer, head_dim, engine):
        super().__init__()
        self.layer, self.head_dim, self.engine = layer, head_dim, engine

    def forward(self, q, k, v, forward_batch=None):
        batch = forward_batch if forward_batch is not None else self.engine.batch
        out = []
        for seq, a, b in _runs(batch.seqs):
            if seq is None:  # padding
                out.append(q.new_zeros(b - a, q.shape[1]))
                continue
            kc, vc = batch.cache.get((self.layer, seq), (k[:0], v[:0]))
            kc, vc = torch.cat([kc, k[a:b]]), torch.cat([vc, v[a:b]])
            batch.cache[(self.layer, seq)] = (kc, vc)
            out.append(self._attend(q[a:b], kc, vc))
        return torch.cat(out)

    def _attend(self, q, k, v):
        """Each query over its sequence's keys up to its own position, as tiny_qwen3's."""
        D, n, L = self.head_dim, q.shape[0], k.shape[0]
        q, k, v = (t.view(t.shape[0], -1, D).transpose(0, 1) for t in (q, k, v))
        rep = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(D)
        allowed = torch.arange(L)[None, :] <= (L - n + torch.arange(n))[:, None]
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        o = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype) @ v
        return o.transpose(0, 1).reshape(n, -1)


class Qwen3Attention(nn.Module):
    def __init__(self, c, layer, par, rope, engine):
        super().__init__()
        self.head_dim, self.flavor = c.head_dim, engine.flavor
        self.q_size = c.num_attention_heads * c.head_dim // par.world
        self.kv_size = c.num_key_value_heads * c.head_dim // par.world
        self.qkv_proj = ColumnParallelLinear(c.hidden_size, self.q_size + 2 * self.kv_size, par)
        self.o_proj = RowParallelLinear(self.q_size, c.hidden_size, par)
        self.rotary_emb = rope
        self.attn = Attention(layer, c.head_dim, engine)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, positions, hidden_states, forward_batch=None):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._by_head(q, self.q_norm), self._by_head(k, self.k_norm)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v) if forward_batch is None else self.attn(q, k, v, forward_batch)
        out, _ = self.o_proj(o)
        return out

    def _by_head(self, x, norm):
        """vLLM's q/k norm sees [T, heads, dim], SGLang's [T·heads, dim]."""
        heads = x.view(*x.shape[:-1], -1, self.head_dim) if self.flavor == "vllm" else x.reshape(-1, self.head_dim)
        return norm(heads).view(x.shape)


class Qwen3MLP(nn.Module):
    def __init__(self, c, par):
        super().__init__()
        inter = c.intermediate_size // par.world
        self.gate_up_proj = ColumnParallelLinear(c.hidden_size, 2 * inter, par)
        self.down_proj = RowParallelLinear(inter, c.hidden_size, par)
        self.act_fn = tiny_qwen3.SiluAndMul()

    def forward(self, x):
        gate_up, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


TopKOutput = namedtuple("TopKOutput", "topk_weights topk_ids router_logits")


def select_experts(router_logits, k, renormalize):
    """Softmax (fp32 at least), the top k, renormalized: as tiny_qwen3's MoE block."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.promote_types(router_logits.dtype, torch.float32))
    w, ids = torch.topk(probs, k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if renormalize else w), ids


class TopK(nn.Module):
    """SGLang's: the routing as a module of its own."""

    def __init__(self, c):
        super().__init__()
        self.k, self.renormalize = c.num_experts_per_tok, c.norm_topk_prob

    def forward(self, hidden_states, router_logits):
        return TopKOutput(*select_experts(router_logits, self.k, self.renormalize), router_logits)


class FusedMoE(nn.Module):
    """w13_weight [E, 2·I, H] ([gate | up] of each expert), w2_weight [E, H, I], I the
    rank's slice; its output is the rank's partial sum (reduce_results=False)."""

    def __init__(self, c, par):
        super().__init__()
        inter = c.moe_intermediate_size // par.world
        self.w13_weight = nn.Parameter(torch.empty(c.num_experts, 2 * inter, c.hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size, inter))
        self.k, self.renormalize, self.par = c.num_experts_per_tok, c.norm_topk_prob, par

    def forward(self, hidden_states, topk_output=None, router_logits=None):
        if topk_output is None:
            w, ids = select_experts(router_logits, self.k, self.renormalize)
        else:
            w, ids = topk_output.topk_weights, topk_output.topk_ids
        w, x = w.to(hidden_states.dtype), self.par.column_input(hidden_states)
        out = torch.zeros_like(x)
        for slot in range(self.k):
            for e in range(self.w13_weight.shape[0]):
                rows = (ids[:, slot] == e).nonzero().squeeze(1)
                if len(rows):
                    g, u = F.linear(x[rows], self.w13_weight[e]).chunk(2, dim=-1)
                    out = out.index_add(0, rows, F.linear(F.silu(g) * u, self.w2_weight[e]) * w[rows, slot, None])
        return out


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, c, par, flavor):
        super().__init__()
        self.par = par
        self.gate = ReplicatedLinear(c.hidden_size, c.num_experts, par)
        self.experts = FusedMoE(c, par)
        if flavor == "sglang":
            self.topk = TopK(c)

    def forward(self, hidden_states):
        router_logits, _ = self.gate(hidden_states)
        if hasattr(self, "topk"):
            out = self.experts(hidden_states, self.topk(hidden_states, router_logits))
        else:
            out = self.experts(hidden_states=hidden_states, router_logits=router_logits)
        return self.par.row_output(out)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, c, layer, par, rope, engine):
        super().__init__()
        self.self_attn = Qwen3Attention(c, layer, par, rope, engine)
        moe = getattr(c, "num_experts", 0) and layer not in c.mlp_only_layers
        self.mlp = Qwen3MoeSparseMoeBlock(c, par, engine.flavor) if moe else Qwen3MLP(c, par)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, forward_batch=None):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class VocabParallelEmbedding(nn.Module):
    """The rank's rows of the vocabulary: another rank's token looks up zeros here, and
    the all-reduce adds the ranks' lookups."""

    def __init__(self, c, par):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.vocab_size // par.world, c.hidden_size))
        self.start, self.par = par.rank * (c.vocab_size // par.world), par

    def forward(self, input_ids):
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local * mine, self.weight) * mine[:, None].to(self.weight.dtype)
        return self.par.row_output(x)


class ParallelLMHead(nn.Module):
    """The rank's rows of the vocabulary; the logits processor reads its weight."""

    def __init__(self, c, par):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.vocab_size // par.world, c.hidden_size))

    def forward(self, *args):
        raise RuntimeError("LMHead's weights should be used in the sampler")


def _logits(hidden_states, lm_head, par):
    return _all_gather(F.linear(hidden_states, lm_head.weight), par)


class VllmLogitsProcessor(nn.Module):
    def __init__(self, par):
        super().__init__()
        self.par = par

    def forward(self, lm_head, hidden_states):
        return _logits(hidden_states, lm_head, self.par)


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor


class SglangLogitsProcessor(nn.Module):
    """The logits of each sequence's last token in the call (extend: cumsum of the
    extend lengths - 1; decode: every token)."""

    def __init__(self, par):
        super().__init__()
        self.par = par

    def forward(self, input_ids, hidden_states, lm_head, forward_batch):
        last = [b - 1 for seq, _, b in _runs(forward_batch.seqs) if seq is not None]
        return LogitsProcessorOutput(_logits(hidden_states[last], lm_head, self.par))


class Qwen3Model(nn.Module):
    def __init__(self, c, par, engine):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(c, par)
        rope = RotaryEmbedding(c)  # get_rope's one instance, in every layer's path
        self.layers = nn.ModuleList([Qwen3DecoderLayer(c, i, par, rope, engine) for i in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, input_ids, positions, forward_batch=None):
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, forward_batch)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class _CausalLM(nn.Module):
    def __init__(self, c, par, engine, logits_processor):
        super().__init__()
        self.config = c
        self.model = Qwen3Model(c, par, engine)
        self.lm_head = ParallelLMHead(c, par)
        self.logits_processor = logits_processor(par)


class VllmCausalLM(_CausalLM):
    def __init__(self, c, par, engine):
        super().__init__(c, par, engine, VllmLogitsProcessor)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.logits_processor(self.lm_head, hidden_states)


class SglangCausalLM(_CausalLM):
    def __init__(self, c, par, engine):
        super().__init__(c, par, engine, SglangLogitsProcessor)

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)


def _model_class(flavor, architecture):
    """The engine's class: its name (Qwen3ForCausalLM, Qwen3MoeForCausalLM) and module,
    as bitparity's for_model reads them."""
    base = VllmCausalLM if flavor == "vllm" else SglangCausalLM
    module = {"vllm": "vllm.model_executor.models.", "sglang": "sglang.srt.models."}[flavor]
    module += "qwen3_moe" if architecture == "Qwen3MoeForCausalLM" else "qwen3"
    return type(architecture, (base,), {"__module__": module})


def engine_state(hf_state, par):
    """The engine's parameters of rank par.rank from Hugging Face's, as its weight
    loaders place them: q/k/v and gate/up fused, column- and row-parallel slices, the
    vocabulary's rows, the experts stacked into w13_weight ([gate | up]) and w2_weight."""
    fused = tiny_qwen3._shard_state(hf_state, tiny_qwen3.Parallel(rank=par.rank, world=par.world, fused=True))
    out, experts = {}, {}
    for name, t in fused.items():
        m = re.fullmatch(r"(.*\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.weight", name)
        if m:
            experts.setdefault((m[1], "w13_weight" if m[3] == "gate_up_proj" else "w2_weight"), {})[int(m[2])] = t
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            n = t.shape[0] // par.world
            out[name] = t[par.rank * n:(par.rank + 1) * n]
        else:
            out[name] = t
    for (prefix, param), per in experts.items():
        out[f"{prefix}.{param}"] = torch.stack([per[e] for e in sorted(per)])
    return out


class Engine:
    """The test's stand-in for an engine's scheduler and model runner: flat forward
    calls of sequences' chunks, each token's sequence in the engine's own metadata,
    the KV cache, and the logits of the sampled rows."""

    def __init__(self, flavor, hf_model, par=None):
        par = par or tiny_qwen3.Parallel(rank=0, world=1, fused=True)
        c = hf_model.config
        self.flavor, self.cache, self.batch = flavor, {}, None
        self.model = _model_class(flavor, c.architectures[0])(c, par, self)
        self.model.to(hf_model.lm_head.weight.dtype)
        self.model.load_state_dict(engine_state(hf_model.state_dict(), par))

    def step(self, chunks, cap=None, rows=None, sampled=None):
        """One forward call of chunks [(seq id, tokens, first position)], cap.rows()
        told each token's sequence (or `rows`, a test's mistake): the sampled rows'
        logits (vLLM: `sampled`, by default the last token of each sequence's chunk)."""
        seqs = [sid for sid, toks, _ in chunks for _ in toks]
        input_ids = torch.tensor([t for _, toks, _ in chunks for t in toks])
        positions = torch.tensor([p + j for _, toks, p in chunks for j in range(len(toks))])
        self.batch = SimpleNamespace(seqs=seqs, cache=self.cache)
        if cap is not None:
            cap.rows(seqs if rows is None else rows, sampled=sampled)
        if self.flavor == "sglang":
            return self.model(input_ids, positions, self.batch).next_token_logits
        hidden = self.model(input_ids, positions)
        last = [b - 1 for seq, _, b in _runs(seqs) if seq is not None]
        return self.model.compute_logits(hidden[last if sampled is None else list(sampled)])


SEQS = [[5, 17, 3, 44, 9], [61, 2, 70], [8, 8, 91, 33, 12, 50, 7]]
# (sequence, start, stop) of each chunk of each call: sequence 0's prompt in two
# chunks, sequence 1's decode token and sequence 2's prompt in the call of sequence
# 0's second chunk, then sequence 2 decoding.
MIXED = [[(0, 0, 3), (1, 0, 2)], [(1, 2, 3), (0, 3, 5), (2, 0, 4)], [(2, 4, 5)], [(2, 5, 6)], [(2, 6, 7)]]
# Every token its own call's last: one token of each sequence a call.
DECODE = [[(s, p, p + 1) for s in range(len(SEQS)) if p < len(SEQS[s])] for p in range(max(map(len, SEQS)))]


def run(engine, schedule, cap=None, every_row=False, pad=0):
    """The schedule's calls of SEQS, the engine's sequence ids "req-<s>", each call
    ending in `pad` padding tokens; every_row: the logits of every token (vLLM's
    compute_logits of every row). The logits of each call."""
    out = []
    for call in schedule:
        chunks = [(f"req-{s}", SEQS[s][a:b], a) for s, a, b in call] + [(None, [0] * pad, 0)] * (pad > 0)
        every = range(sum(b - a for _, a, b in call)) if every_row else None
        out.append(engine.step(chunks, cap, sampled=every))
    return out


def hf_capture(hf_model):
    """The Hugging Face model's capture of each sequence's extend: the reference."""
    with bitparity.capture(hf_model) as cap:
        for s in SEQS:
            hf_model(torch.tensor([s]))
    return cap
