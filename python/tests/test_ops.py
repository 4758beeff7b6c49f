"""bitparity.ops (docs/torch-ops.md) against the oracle's own run: the CLI's `bitparity run`
of a Hugging Face checkpoint (fixtures/hf/dense-gqa1-untied-sharded: untied, so the LM
head's gradient is the head's alone) with ops captured and gradients, and the torch ops
applied to the run's own captured inputs. Forward: the embedding, every norm, projection
and RoPE, the logits and the logprobs and entropy are the run's bits. Backward: through
logprob -> LM head -> final norm, the gradients of lm_head.weight and model.norm.weight
are the run's bits (they come from the head alone, SPEC.md §6.5). The whole model built
of the ops, dense and MoE (fixtures/hf/qwen3-moe-tiny), gives the run's logprobs, entropy
and every parameter's gradient. The
negative controls: another contract's LM head gradient, and the loss's coefficients of
another row order, differ. RoPE's backward is the transpose of its forward within the
bound of its two roundings."""

import json
import os

import pytest
import torch

import bitparity
import bitparity.ops as ops
import tiny_qwen3

if ops._C is None and os.environ.get("BITPARITY_REQUIRE_OPS") != "1":  # the tests' install requires it
    pytest.skip("this installation has no bitparity._C (docs/torch-ops.md)", allow_module_level=True)

SOURCE = os.environ.get("BP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SOURCE, "fixtures", "hf", "dense-gqa1-untied-sharded")
MOE_MODEL = os.path.join(SOURCE, "fixtures", "hf", "qwen3-moe-tiny")
SEQS = [[5, 17, 3, 44, 9, 100, 2], [61, 2, 70, 11]]
COEFS = [[0.5, -1.25, 2.0, 0.75, 1.0, -0.5], [1.5, 0.25, -2.0]]
CONTRACTS = ["bf16-sm90tc-v3", "bf16-fmaseq-v3"]


def weights(model=MODEL):
    return tiny_qwen3.checkpoint_weights(model)


def config(model=MODEL):
    return tiny_qwen3.checkpoint_config(model)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """`bitparity run`'s dump of a checkpoint under a contract, ops and gradients, made once."""
    folder, dumps = tmp_path_factory.mktemp("oracle"), {}

    def get(name, model=MODEL, sequences=len(SEQS)):
        tokens = folder / f"tokens-{sequences}.json"
        if not tokens.exists():
            tokens.write_text(json.dumps({"sequences": SEQS[:sequences], "coefficients": COEFS[:sequences]}))
        if (model, name, sequences) not in dumps:
            out = str(folder / f"{os.path.basename(model)}-{name}-{sequences}.safetensors")
            bitparity.run(out, model + "/", tokens=str(tokens), contract=name)
            dumps[model, name, sequences] = bitparity.read_dump(out)[0]
        return dumps[model, name, sequences]
    return get


def positions():
    return torch.tensor([p for s in SEQS for p in range(len(s))], dtype=torch.int32)


def target_rows():
    """(rows of the packed batch that predict a next token, their targets)."""
    rows, targets, at = [], [], 0
    for s in SEQS:
        rows += range(at, at + len(s) - 1)
        targets += s[1:]
        at += len(s)
    return torch.tensor(rows), torch.tensor(targets, dtype=torch.int32)


@pytest.mark.parametrize("name", CONTRACTS)
def test_each_forward_op_is_the_runs_bits(oracle, name):
    run, w, cfg, c = oracle(name), weights(), config(), ops.contract(name)
    eps, D = cfg["rms_norm_eps"], cfg["head_dim"]
    tokens = torch.tensor([t for s in SEQS for t in s], dtype=torch.int32)
    assert torch.equal(ops.embedding(tokens, w["model.embed_tokens.weight"], c), run["ops.embed"])
    tables = ops.rope_tables(cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"],
                             D, 64)
    for i in range(cfg["num_hidden_layers"]):
        p, at = f"model.layers.{i}.", f"ops.layers.{i}."
        x = run["ops.embed"] if i == 0 else run[f"ops.layers.{i - 1}.resid_mlp"]
        assert torch.equal(ops.rmsnorm(x, w[p + "input_layernorm.weight"], eps, c), run[at + "input_norm"])
        for proj in ("q", "k", "v"):
            got = ops.linear(run[at + "input_norm"], w[p + f"self_attn.{proj}_proj.weight"], c)
            assert torch.equal(got, run[at + f"{proj}_proj"]), proj
        for h in ("q", "k"):
            heads = run[at + f"{h}_proj"].shape[1] // D
            normed = ops.rmsnorm(run[at + f"{h}_proj"], w[p + f"self_attn.{h}_norm.weight"], eps, c, heads=heads)
            assert torch.equal(normed, run[at + f"{h}_norm"]), h
            assert torch.equal(ops.rope(run[at + f"{h}_norm"], positions(), tables, c), run[at + f"{h}_rope"]), h
        assert torch.equal(ops.rmsnorm(run[at + "resid_attn"], w[p + "post_attention_layernorm.weight"], eps, c),
                           run[at + "post_norm"])
    last = run[f"ops.layers.{cfg['num_hidden_layers'] - 1}.resid_mlp"]
    assert torch.equal(ops.rmsnorm(last, w["model.norm.weight"], eps, c), run["ops.final_norm"])
    assert torch.equal(ops.linear(run["ops.final_norm"], w["lm_head.weight"], c), run["ops.logits"])


def head(run, w, c, coefs):
    """logprob -> LM head -> final norm from the run's last layer output; the loss's backward."""
    cfg = config()
    x = run[f"ops.layers.{cfg['num_hidden_layers'] - 1}.resid_mlp"].clone().requires_grad_(True)
    norm_w = w["model.norm.weight"].clone().requires_grad_(True)
    lm = w["lm_head.weight"].clone().requires_grad_(True)
    logits = ops.linear(ops.rmsnorm(x, norm_w, cfg["rms_norm_eps"], c), lm, c, n_chunks=c.tp_tree_width)
    rows, targets = target_rows()
    lp, entropy = ops.logprob(logits[rows], targets, c)
    (lp * torch.tensor([v for row in coefs for v in row])).sum().backward()
    return lp, entropy, norm_w.grad, lm.grad


@pytest.mark.parametrize("name", CONTRACTS)
def test_the_heads_backward_is_the_runs_bits(oracle, name):
    run, w, c = oracle(name), weights(), ops.contract(name)
    lp, entropy, d_norm, d_lm = head(run, w, c, COEFS)
    at = 0
    for s, seq in enumerate(SEQS):
        n = len(seq) - 1
        assert torch.equal(lp[at:at + n].detach(), run[f"logprobs.{s}"]), s
        assert torch.equal(entropy[at:at + n], run[f"entropy.{s}"]), s
        at += n
    assert d_norm.dtype == torch.float32 and d_lm.dtype == torch.float32
    assert torch.equal(d_norm, run["grads.model.norm.weight"])
    assert torch.equal(d_lm, run["grads.lm_head.weight"])
    # Negative controls: another contract's bits, and the coefficients of other rows.
    other = "bf16-fmaseq-v3" if name == "bf16-sm90tc-v3" else "bf16-sm90tc-v3"
    assert not torch.equal(head(run, w, ops.contract(other), COEFS)[3], d_lm)
    assert not torch.equal(head(run, w, c, [COEFS[0][::-1], COEFS[1]])[3], d_lm)


def hf_model(model):
    return tiny_qwen3.load(model)


def patched_loss(model, c, packed=False, stacked=False):
    """The patched model on SEQS as one batch, the second row left-padded (packed: both
    sequences in one row, position_ids restarting; stacked: the experts in transformers 5's
    layout); the loss's backward."""
    m = hf_model(model)
    m = bitparity.patch(tiny_qwen3.stack_experts(m) if stacked else m, c)
    if packed:
        ids, pos = torch.tensor([SEQS[0] + SEQS[1]]), torch.tensor([list(range(len(SEQS[0]))) + list(range(len(SEQS[1])))])
        coef = torch.tensor([COEFS[0] + [0.0] + COEFS[1]])  # the first sequence's last token predicts nothing
        out = m(ids, position_ids=pos)
        (out.logprobs * coef).sum().backward()
        lp, entropy, n0 = out.logprobs[0][out.logprob_mask[0]].detach(), out.entropy[0][out.logprob_mask[0]], len(COEFS[0])
        return [lp[:n0], lp[n0:]], [entropy[:n0], entropy[n0:]], {n: p.grad for n, p in m.named_parameters()}
    ids, mask, coef = tiny_qwen3.padded_batch(SEQS, COEFS)
    out = m(ids, attention_mask=mask)
    (out.logprobs * coef).sum().backward()
    lp = [out.logprobs[b][out.logprob_mask[b]].detach() for b in range(2)]
    entropy = [out.entropy[b][out.logprob_mask[b]] for b in range(2)]
    return lp, entropy, {n[len("grads."):]: g for n, g in bitparity.named_gradients(m)[0].items()}


@pytest.mark.parametrize("name", CONTRACTS)
def test_stacked_experts_are_the_runs_bits(oracle, name):
    """The MoE checkpoint with its experts stacked as transformers 5 holds them: the same
    logprobs, entropy and gradients (the stacked ones split per expert) as the run's."""
    run = oracle(name, MOE_MODEL)
    lp, entropy, grads = patched_loss(MOE_MODEL, name, stacked=True)
    assert all(torch.equal(lp[s], run[f"logprobs.{s}"]) for s in range(len(SEQS)))
    assert all(torch.equal(entropy[s], run[f"entropy.{s}"]) for s in range(len(SEQS)))
    expected = {k[len("grads."):]: v for k, v in run.items() if k.startswith("grads.")}
    assert set(grads) == set(expected)
    assert not [n for n in expected if not torch.equal(grads[n], expected[n])]


def three_linears(a, wq, wk, wv, c):
    """q, k, v as three separate linears: autograd rounds each input gradient and adds them in bf16."""
    return tuple(ops.linear(a, w, c) for w in (wq, wk, wv))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("model", [MODEL, MOE_MODEL], ids=["dense", "moe"])
@pytest.mark.parametrize("name", CONTRACTS)
def test_a_patched_model_is_the_runs_bits(oracle, name, model, packed, monkeypatch):
    """A torch Qwen3 / Qwen3-MoE with Hugging Face's module names, bitparity.patch'ed, on a
    left-padded batch and on both sequences packed in one row: its logprobs, entropy and
    every parameter's gradient are `bitparity run --implementation reference`'s, bit for
    bit. The negative control: q, k, v as three separate linears (their input gradients
    rounded and added in bf16 by autograd) change the gradients below them."""
    run = oracle(name, model)
    lp, entropy, grads = patched_loss(model, name, packed)
    for s in range(len(SEQS)):
        assert torch.equal(lp[s], run[f"logprobs.{s}"]), s
        assert torch.equal(entropy[s], run[f"entropy.{s}"]), s
    expected = {k[len("grads."):]: v for k, v in run.items() if k.startswith("grads.")}
    assert set(grads) == set(expected)
    differing = [n for n in expected if not torch.equal(grads[n], expected[n])]
    assert not differing, differing
    monkeypatch.setattr(ops, "qkv", three_linears)
    unfused = patched_loss(model, name, packed)[2]
    assert not torch.equal(unfused["model.embed_tokens.weight"], expected["model.embed_tokens.weight"])


def test_one_sequence_is_the_runs_bits_of_it_alone(oracle):
    """One unpadded sequence, whose predicting rows are one run (the head reads them from
    the logits as a view, not a gather): its logprobs, entropy and every parameter's
    gradient are those of `bitparity run` of that sequence alone. The negative control:
    the coefficients in reverse order change the LM head's gradient."""
    name = "bf16-sm90tc-v3"
    run = oracle(name, MODEL, sequences=1)

    def loss(coef):
        m = bitparity.patch(hf_model(MODEL), name)
        out = m(torch.tensor([SEQS[0]]))
        (out.logprobs[0] * coef).sum().backward()
        return out, {n[len("grads."):]: g for n, g in bitparity.named_gradients(m)[0].items()}

    out, grads = loss(torch.tensor(COEFS[0]))
    assert torch.equal(out.logprobs[0].detach(), run["logprobs.0"])
    assert torch.equal(out.entropy[0], run["entropy.0"])
    expected = {k[len("grads."):]: v for k, v in run.items() if k.startswith("grads.")}
    assert set(grads) == set(expected)
    assert not [n for n in expected if not torch.equal(grads[n], expected[n])]
    reversed_grads = loss(torch.tensor(COEFS[0][::-1]))[1]
    assert not torch.equal(reversed_grads["lm_head.weight"], expected["lm_head.weight"])


class ConcatCache:
    """Hugging Face's DynamicCache as the patch uses it (transformers is not in Debian; the
    device stage python_patch runs the real one): per layer, keys and values [B, kv_heads,
    columns, D], each update appended along the columns and the whole returned."""

    def __init__(self):
        self.kv = []

    def get_seq_length(self, layer_idx=0):
        return self.kv[layer_idx][0].shape[-2] if layer_idx < len(self.kv) else 0

    def update(self, k, v, layer_idx, cache_kwargs=None):
        if layer_idx == len(self.kv):
            self.kv.append((k, v))
        else:
            self.kv[layer_idx] = tuple(torch.cat([old, new], dim=-2) for old, new in zip(self.kv[layer_idx], (k, v)))
        return self.kv[layer_idx]


@pytest.mark.parametrize("model", [MODEL, MOE_MODEL], ids=["dense", "moe"])
@pytest.mark.parametrize("cache", ["own", "hf"])
def test_chunked_prefill_and_decoding_are_the_runs_bits(oracle, model, cache):
    """Through a KV cache, the patched model's own or Hugging Face's layout (the attention
    mask then covering the cached columns too): one call prefilling the first sequence's
    first 4 tokens beside the second's first (left-padded), then three steps of one token
    each for both rows, under torch.no_grad(). The logits of every position, their
    contract logprobs and entropy are the whole-sequence run's, bit for bit."""
    name = "bf16-sm90tc-v3"
    run, c = oracle(name, model), ops.contract(name)
    m = bitparity.patch(hf_model(model), c)
    s0, s1 = SEQS
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]])
    with torch.no_grad():
        out = m(torch.tensor([s0[:4], [0, 0, 0, s1[0]]]), attention_mask=mask, use_cache=True,
                past_key_values=ConcatCache() if cache == "hf" else None)
        rows = [list(out.logits[0]), [out.logits[1, 3]]]
        for t in range(3):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
            out = m(torch.tensor([[s0[4 + t]], [s1[1 + t]]]), past_key_values=out.past_key_values, use_cache=True,
                    attention_mask=mask if cache == "hf" else None)
            rows[0].append(out.logits[0, 0])
            rows[1].append(out.logits[1, 0])
        for b, seq in enumerate(SEQS):
            lp, entropy = ops.logprob(torch.stack(rows[b][:-1]), torch.tensor(seq[1:]), c)
            assert torch.equal(lp, run[f"logprobs.{b}"]), b
            assert torch.equal(entropy, run[f"entropy.{b}"]), b
    if cache == "own":
        assert out.past_key_values.length == [7, 4]
    else:
        assert out.past_key_values.get_seq_length() == 7


@pytest.mark.parametrize("mask", [False, True], ids=["no-mask", "ones"])
def test_an_unpadded_batch_through_hf_cache_is_the_runs_bits(oracle, mask):
    """Both rows unpadded (no mask, or a mask of ones over the cached and new columns):
    the DynamicCache's keys are read back whole, not row by row; a prefill of 3 tokens and
    one decoding step give the run's logprobs."""
    name = "bf16-sm90tc-v3"
    run, c = oracle(name, MODEL), ops.contract(name)
    m = bitparity.patch(hf_model(MODEL), c)
    cache, rows = ConcatCache(), [[], []]
    with torch.no_grad():
        for cols in (slice(0, 3), slice(3, 4)):
            ids = torch.tensor([SEQS[0][cols], SEQS[1][cols]])
            full = torch.ones(2, cols.stop, dtype=torch.long) if mask else None
            out = m(ids, attention_mask=full, past_key_values=cache, use_cache=True)
            for b in range(2):
                rows[b] += list(out.logits[b])
    for b, seq in enumerate(SEQS):
        lp, _ = ops.logprob(torch.stack(rows[b][:3]), torch.tensor(seq[1:4]), c)
        assert torch.equal(lp, run[f"logprobs.{b}"][:3]), b


def test_the_patch_refuses_what_it_cannot_run():
    m = bitparity.patch(hf_model(MODEL), "bf16-fmaseq-v3")
    ids = torch.tensor([[5, 17, 3, 44]])
    with pytest.raises(RuntimeError, match="torch.no_grad"):
        m(ids, use_cache=True)
    with pytest.raises(TypeError, match="pass back the patched model's own"):
        m(ids, past_key_values=[])
    with torch.no_grad(), pytest.raises(ValueError, match="covers the cached and the new columns"):
        cache = m(ids, use_cache=True, past_key_values=ConcatCache()).past_key_values
        m(ids[:, :1], attention_mask=torch.ones(1, 1), past_key_values=cache)
    with pytest.raises(ValueError, match="not one run"):
        m(ids, attention_mask=torch.tensor([[1, 0, 1, 1]]))
    with pytest.raises(ValueError, match="count up"):
        m(ids, position_ids=torch.tensor([[0, 1, 3, 4]]))
    with pytest.raises(TypeError, match="labels"):
        m(ids, labels=ids)


def test_an_op_refuses_a_device_it_cannot_run_on():
    """Every tensor of a call on one device, and a device this build runs: here the CPU
    alone (a build without CUDA, as Debian's torch is); `meta` stands for the others."""
    c = ops.contract("bf16-sm90tc-v3")
    x, w = torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)
    assert ops.rmsnorm(x, w, 1e-6, c).shape == (2, 4)
    with pytest.raises(RuntimeError, match="a tensor is on meta: this build of bitparity._C has the CPU reference"):
        ops.rmsnorm(x.to("meta"), w, 1e-6, c)
    with pytest.raises(RuntimeError, match="weight is on meta, the op's other tensors on cpu"):
        ops.rmsnorm(x, w.to("meta"), 1e-6, c)
    assert not ops.has_cuda()


def test_rope_backward_is_the_forwards_transpose():
    """Each element of rope_bwd(g) is R(R(a) ± R(b)) with a, b exact products of g and the
    bf16 tables; from the float64 transpose a ± b it is at most u(1+u)(|a|+|b|) + u|a ± b|
    away, u = 2^-8 (bf16's unit roundoff): one rounding of each product, one of the sum."""
    c, D, T, H = ops.contract("bf16-sm90tc-v3"), 16, 9, 3
    cos, sin = ops.rope_tables(1e6, D, T)
    pos = torch.arange(T, dtype=torch.int32)
    g = torch.randn(T, H * D, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x = torch.zeros(T, H * D, dtype=torch.bfloat16, requires_grad=True)
    ops.rope(x, pos, (cos, sin), c).backward(g)
    gd = g.double().view(T, H, 2, D // 2)
    cd, sd = cos.double()[pos.long()][:, None, :], sin.double()[pos.long()][:, None, :]
    a1, b1 = gd[:, :, 0] * cd, gd[:, :, 1] * sd  # first half: g1·c + g2·s
    a2, b2 = gd[:, :, 1] * cd, -gd[:, :, 0] * sd  # second half: g2·c − g1·s
    exact = torch.stack([a1 + b1, a2 + b2], dim=2).reshape(T, H * D)
    mag = torch.stack([a1.abs() + b1.abs(), a2.abs() + b2.abs()], dim=2).reshape(T, H * D)
    u = 2.0 ** -8
    err = (x.grad.double() - exact).abs()
    assert bool((err <= u * (1 + u) * mag + u * exact.abs()).all()), float(err.max())
    assert float(err.max()) > 0  # the bound is exercised: bf16 rounding happened


def test_mistakes_are_named():
    c = ops.contract("bf16-fmaseq-v3")
    with pytest.raises(ValueError, match="no contract 'bf16-nope'"):
        ops.contract("bf16-nope")
    x = torch.zeros(2, 4, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="fp32 master copy"):
        ops.linear(x, torch.zeros(3, 4, dtype=torch.bfloat16, requires_grad=True), c).sum().backward()
    with pytest.raises(ValueError, match="not bf16"):
        ops.linear(x, torch.full((3, 4), 0.1), c)
    with pytest.raises(TypeError, match="bf16 \\[tokens, features\\]"):
        ops.rmsnorm(torch.zeros(2, 4), torch.ones(4), 1e-6, c)
    with pytest.raises(ValueError, match="outside"):
        ops.embedding(torch.tensor([7]), torch.zeros(4, 2), c)
