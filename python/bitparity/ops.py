"""bitparity.ops: the contract's ops as torch ops, forward and backward (docs/torch-ops.md).

A CPU tensor runs the reference op itself (bitparity._C, compiled from reference/ with
SPEC.md §3's flags), so its bits are the oracle's; a CUDA tensor runs optimized/cuda's twin
of the op on torch's current stream (same bits), where the package was built with CUDA
(setup.py; bitparity.ops.has_cuda()). Every tensor of a call is on one device. Activations are bf16 [tokens, features]
in the canonical token order; weight gradients are fp32 (SPEC.md §4), so a weight that
takes a gradient is an fp32 tensor holding bf16 values (a trainer's master weights): the
op reads it as bf16, exactly, and its gradient comes out fp32.

    import bitparity.ops as bo
    c = bo.contract("bf16-sm90tc-v3")
    h = bo.rmsnorm(x, norm_weight, 1e-6, c)
    logits = bo.linear(h, lm_head_weight, c)
    logprob, entropy = bo.logprob(logits[rows], targets, c)

The ops: embedding, rmsnorm, qkv, rope, attention (whole sequences; after cached keys,
forward), linear, the dense mlp, the MoE block and logprob (with entropy).
"""

from dataclasses import dataclass

import torch

try:
    from . import _C
except ImportError as e:  # built without torch's C++ headers (setup.py)
    _C = None
    _MISSING = str(e)


class OpsUnavailable(ImportError):
    """This installation has no bitparity._C: says what its build lacked."""


def has_cuda():
    """Whether this build of bitparity._C runs CUDA tensors (on optimized/cuda's kernels)."""
    return _ops().built_with_cuda()


def _ops():
    if _C is None:
        raise OpsUnavailable(f"bitparity.ops needs bitparity._C, which this installation lacks ({_MISSING}): "
                             "reinstall with torch's C++ headers present (Debian: apt-get install libtorch-dev "
                             "pybind11-dev; then pip install ./python)")
    return _C


@dataclass(frozen=True)
class Contract:
    """A named contract (SPEC.md §1), its knob hash as reports stamp it, and its
    tp_tree_width: the chunks of a shardable reduction (linear's k_chunks of a
    row-parallel layer, n_chunks of a column-parallel one's input gradient); whether its
    log-softmax is one-pass (v2's chunk states) or two-pass (v1); its weight gradients' token
    chunk (the canonical order's rows each chunk sums before the pairwise tree)."""
    name: str
    knob_hash: str
    tp_tree_width: int
    one_pass_logprob: bool
    grad_token_chunk: int


def contract(name):
    """The contract of that name; ValueError naming the known ones otherwise."""
    names = _ops().contract_names()
    if name not in names:
        raise ValueError(f"no contract {name!r}: one of {names}")
    return Contract(name, _C.knob_hash(name), _C.tp_tree_width(name), _C.log_softmax_one_pass(name),
                    _C.grad_token_chunk(name))


def _name(c):
    if not isinstance(c, Contract):
        raise TypeError(f"expected a bitparity.ops.Contract (bitparity.ops.contract(name)), got {type(c).__name__}")
    return c.name


def _as_bf16(w, what):
    """A weight as the op reads it: bf16, or an fp32 master copy holding bf16 values exactly."""
    if w.dtype == torch.bfloat16:
        return w.detach().contiguous()
    if w.dtype != torch.float32:
        raise TypeError(f"{what} is {w.dtype}: the contract's weights are bf16 values (bf16, or fp32 holding them)")
    # Its bf16 copy is made and checked once per version of the weight (an optimizer's step
    # or a copy into it makes a new one) and kept on the weight itself.
    key = (w._version, w.data_ptr())
    hit = getattr(w, "_bitparity_bf16", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    b = w.detach().to(torch.bfloat16).contiguous()
    if not torch.equal(b.float(), w.detach()):
        raise ValueError(f"{what} holds values that are not bf16: round it to bf16 first (the contract's weights are)")
    w._bitparity_bf16 = (key, b)
    return b


def _weight_grad(w, g32, what):
    """The fp32 gradient of weight w, for autograd (which gives a tensor its own dtype)."""
    if w.dtype != torch.float32:
        raise TypeError(f"{what} is {w.dtype}: its contract gradient is fp32, so keep the weight as an fp32 master "
                        "copy holding bf16 values (docs/torch-ops.md)")
    return g32


def _activation(x, what):
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError(f"{what} must be a bf16 [tokens, features] tensor, got {x.dtype} {list(x.shape)}")
    return x.contiguous()


def _int32(t, what):
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(f"{what} must be a 1-D integer tensor, got {t.dtype} {list(t.shape)}")
    return t.to(torch.int32).contiguous()


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, table, name):
        ctx.save_for_backward(tokens)
        ctx.vocab, ctx.name = table.shape[0], name
        return _C.embedding_fwd(tokens, _as_bf16(table, "the embedding table"), name)

    @staticmethod
    def backward(ctx, dout):
        (tokens,) = ctx.saved_tensors
        return None, _C.embedding_bwd(tokens, dout.contiguous(), ctx.vocab, ctx.name), None


def embedding(tokens, table, c):
    """Rows of `table` [V, H] for `tokens` [T] (SPEC.md §5.1); its gradient token-chunked, fp32."""
    _ops()
    return _Embedding.apply(_int32(tokens, "tokens"), table, _name(c))


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, heads, name):
        w = _as_bf16(weight, "the norm's weight")
        out, rstd = _C.rmsnorm_fwd(x, w, eps, heads, name)
        ctx.save_for_backward(x, w, rstd, weight)
        ctx.heads, ctx.name = heads, name
        return out

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd, weight = ctx.saved_tensors
        dx, dw = _C.rmsnorm_bwd(x, w, rstd, dy.contiguous(), ctx.heads, ctx.name)
        dweight = _weight_grad(weight, dw, "the norm's weight") if ctx.needs_input_grad[1] else None
        return dx, dweight, None, None, None


def rmsnorm(x, weight, eps, c, heads=1):
    """RMSNorm of each of `heads` slices of x [T, heads·n] by weight [n] (SPEC.md §5.2)."""
    _ops()
    return _RmsNorm.apply(_activation(x, "x"), weight, float(eps), int(heads), _name(c))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, k_chunks, n_chunks, name):
        w = _as_bf16(weight, "the weight")
        ctx.save_for_backward(x, w, weight)
        ctx.n_chunks, ctx.name = n_chunks, name
        return _C.linear_fwd(x, w, k_chunks, name)

    @staticmethod
    def backward(ctx, dy):
        x, w, weight = ctx.saved_tensors
        dx, dw = _C.linear_bwd(x, w, dy.contiguous(), ctx.n_chunks, ctx.name)
        dweight = _weight_grad(weight, dw, "the weight") if ctx.needs_input_grad[1] else None
        return dx, dweight, None, None, None


def linear(x, weight, c, k_chunks=1, n_chunks=1):
    """x [T, K] · weightᵀ [N, K] (SPEC.md §5.4): K cut into k_chunks for the forward (a
    row-parallel layer's tp_tree_width), N into n_chunks for the input gradient (a
    column-parallel one's, the LM head's)."""
    _ops()
    return _Linear.apply(_activation(x, "x"), weight, int(k_chunks), int(n_chunks), _name(c))


class _Qkv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, wq, wk, wv, name):
        ws = [_as_bf16(w, f"the {p} weight") for w, p in zip((wq, wk, wv), "qkv")]
        ctx.save_for_backward(a, *ws, wq, wk, wv)
        ctx.name = name
        return tuple(_C.linear_fwd(a, w, 1, name) for w in ws)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        a, bq, bk, bv, wq, wk, wv = ctx.saved_tensors
        grads = [g.contiguous() if g is not None else a.new_zeros(a.shape[0], w.shape[0])
                 for g, w in zip((dq, dk, dv), (bq, bk, bv))]
        da, *dws = _C.qkv_bwd(a, [bq, bk, bv], grads, ctx.name)
        dws = [_weight_grad(w, g, f"the {p} weight") if need else None
               for w, g, p, need in zip((wq, wk, wv), dws, "qkv", ctx.needs_input_grad[1:4])]
        return (da, *dws, None)


def qkv(a, wq, wk, wv, c):
    """(a·Wqᵀ, a·Wkᵀ, a·Wvᵀ), each a linear of K unsplit; the backward sums the three
    input-gradient accumulators in fp32 before one rounding, as SPEC.md §6.5 does (three
    separate linears would round each and let autograd add the bf16 results)."""
    _ops()
    return _Qkv.apply(_activation(a, "a"), wq, wk, wv, _name(c))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lengths, head_dim, name):
        o, m, l = _C.attention_fwd(q, k, v, lengths, head_dim, name)
        ctx.save_for_backward(q, k, v, o, m, l)
        ctx.lengths, ctx.head_dim, ctx.name = lengths, head_dim, name
        return o

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o, m, l = ctx.saved_tensors
        dq, dk, dv = _C.attention_bwd(q, k, v, o, m, l, dout.contiguous(), ctx.lengths, ctx.head_dim, ctx.name)
        return dq, dk, dv, None, None, None


def attention(q, k, v, lengths, head_dim, c):
    """Causal attention of whole sequences packed one after another (`lengths` tokens
    each): q [T, Hq·D], k and v [T, Hkv·D] after RoPE (SPEC.md §5.6, extend)."""
    _ops()
    return _Attention.apply(_activation(q, "q"), _activation(k, "k"), _activation(v, "v"),
                            [int(n) for n in lengths], int(head_dim), _name(c))


def attention_cached(q, k, v, sequences, head_dim, c):
    """Attention of new queries after cached keys (chunked prefill, decoding: SPEC.md §5.6's
    paths, the same bits as extend): `sequences` are (q_begin, q_len, past_len, kv_begin),
    k and v [rows, Hkv·D] hold each sequence's keys 0 .. past_len + q_len - 1 from kv_begin.
    Forward only: the contract's backward runs whole sequences (SPEC.md §6.5)."""
    _ops()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError("bitparity.ops.attention_cached has no backward: the contract's backward runs whole "
                           "sequences (SPEC.md §6.5); run it under torch.no_grad()")
    return _C.attention_cached_fwd(_activation(q, "q"), _activation(k, "k"), _activation(v, "v"),
                                   [[int(x) for x in s] for s in sequences], int(head_dim), _name(c))[0]


class _Mlp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, wg, wu, wd, name):
        ws = [_as_bf16(w, f"the {p} weight") for w, p in zip((wg, wu, wd), ("gate", "up", "down"))]
        ctx.save_for_backward(a, *ws, wg, wu, wd)
        ctx.name = name
        return _C.mlp_fwd(a, *ws, name)

    @staticmethod
    def backward(ctx, dd):
        a, bg, bu, bd, wg, wu, wd = ctx.saved_tensors
        da, *dws = _C.mlp_bwd(a, bg, bu, bd, dd.contiguous(), ctx.name)
        dws = [_weight_grad(w, g, f"the {p} weight") if need else None
               for w, g, p, need in zip((wg, wu, wd), dws, ("gate", "up", "down"), ctx.needs_input_grad[1:4])]
        return (da, *dws, None)


def mlp(a, w_gate, w_up, w_down, c):
    """The dense MLP, R(silu(g)·u)·Wdᵀ with the down projection's K in tp_tree_width
    chunks (SPEC.md §5.7); its backward sums gate's and up's input gradients in fp32
    before one rounding."""
    _ops()
    return _Mlp.apply(_activation(a, "a"), w_gate, w_up, w_down, _name(c))


class _Moe(torch.autograd.Function):
    """The MoE block over per-expert weights (gate, up, down of each expert in turn) or,
    `stacked`, over transformers 5's stacked gate_up [E, 2I, H] and down [E, H, I], whose
    gradients then come out stacked too."""

    @staticmethod
    def forward(ctx, a, router, k, norm_topk_prob, name, stacked, *experts):
        b = [_as_bf16(w, f"the experts' weight {i}") for i, w in enumerate(experts)]
        br = _as_bf16(router, "the router's weight")
        ctx.save_for_backward(a, br, router, *b, *experts)
        ctx.k, ctx.norm, ctx.name, ctx.stacked, ctx.n = k, norm_topk_prob, name, stacked, len(experts)
        if stacked:
            return _C.moe_stacked_fwd(a, br, *b, k, norm_topk_prob, name)
        return _C.moe_fwd(a, br, b[0::3], b[1::3], b[2::3], k, norm_topk_prob, name)

    @staticmethod
    def backward(ctx, dout):
        a, br, router, *rest = ctx.saved_tensors
        b, experts = rest[:ctx.n], rest[ctx.n:]
        if ctx.stacked:
            da, dwr, *dws = _C.moe_stacked_bwd(a, br, *b, dout.contiguous(), ctx.k, ctx.norm, ctx.name)
        else:
            da, dwr, *dws = _C.moe_bwd(a, br, b[0::3], b[1::3], b[2::3], dout.contiguous(), ctx.k, ctx.norm, ctx.name)
        need = ctx.needs_input_grad
        drouter = _weight_grad(router, dwr, "the router's weight") if need[1] else None
        dexperts = [_weight_grad(w, g, "an expert's weight") if need[6 + i] else None
                    for i, (w, g) in enumerate(zip(experts, dws))]
        return (da, drouter, None, None, None, None, *dexperts)


def moe(a, router, experts, k, norm_topk_prob, c):
    """The Qwen3-MoE block (SPEC.md §5.8, §5.9): router logits, top-k (ties to the lower
    expert), routing weights, each token's experts and their combine in slot order.
    `experts`: per expert (gate [I, H], up [I, H], down [H, I]), or transformers 5's stacked
    (gate_up [E, 2I, H], each expert's gate rows first, down [E, H, I]) as one pair of 3-D
    tensors. The backward adds the router's input gradient to the experts' before one
    rounding."""
    _ops()
    stacked = len(experts) == 2 and all(torch.is_tensor(w) and w.dim() == 3 for w in experts)
    flat = list(experts) if stacked else [w for e in experts for w in e]
    return _Moe.apply(_activation(a, "a"), router, int(k), bool(norm_topk_prob), _name(c), stacked, *flat)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, cos, sin, name):
        ctx.save_for_backward(positions, cos, sin)
        ctx.name = name
        return _C.rope_apply(x, positions, cos, sin, False, name)

    @staticmethod
    def backward(ctx, dout):
        positions, cos, sin = ctx.saved_tensors
        return _C.rope_apply(dout.contiguous(), positions, cos, sin, True, ctx.name), None, None, None, None


def rope_tables(theta, head_dim, max_positions):
    """The contract's bf16 cos and sin tables, [max_positions, head_dim/2] each (SPEC.md §5.5)."""
    return tuple(_ops().rope_tables(float(theta), int(head_dim), int(max_positions)))


def rope(x, positions, tables, c):
    """Each head of x [T, H·D] rotated by its token's position (SPEC.md §5.5); `tables`
    from rope_tables covering every position (moved to x's device where they are not)."""
    _ops()
    cos, sin = (t.to(x.device) for t in tables)
    return _Rope.apply(_activation(x, "x"), _int32(positions, "positions"), cos, sin, _name(c))


class _Logprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, name):
        lp, entropy, row_max, row_sum = _C.logprob_fwd(logits, targets, temperature, name)
        ctx.save_for_backward(logits, targets, row_max, row_sum)
        ctx.temperature, ctx.name = temperature, name
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(entropy)
        return lp, entropy

    @staticmethod
    def backward(ctx, dlp, dentropy):
        if dlp is None:
            return None, None, None, None
        logits, targets, row_max, row_sum = ctx.saved_tensors
        coef = dlp.to(torch.float32).contiguous()
        return _C.logprob_bwd(logits, targets, coef, row_max, row_sum, ctx.temperature, ctx.name), None, None, None


def logprob(logits, targets, c, temperature=1.0):
    """(logprob, entropy), fp32 [R], of each row of logits [R, V] at its target (SPEC.md
    §5.10). The logprob's gradient is the contract's: the loss's coefficient c_r of each
    row is the gradient arriving at logprob r. The contract defines no entropy gradient."""
    _ops()
    return _Logprob.apply(_activation(logits, "logits"), _int32(targets, "targets"), float(temperature), _name(c))
