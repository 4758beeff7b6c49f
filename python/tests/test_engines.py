"""bitparity's vLLM and SGLang maps on look-alikes of those engines' Qwen3 and
Qwen3-MoE (tiny_engines: their module names, flat calls with positions, fused-residual
norms, (out, bias) tuples, one rotary_emb shared by the layers, fused and stacked
weights, the logits of the sampled rows): each engine's capture of a mixed batch (a
prefill chunk, decode tokens and a new prompt in one flat call, padding at its end)
is the Hugging Face model's capture of the same sequences, and each new mechanism's
misuse is named or seen."""

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

import bitparity
import tiny_engines
import tiny_qwen3
from tiny_engines import DECODE, MIXED, SEQS, Engine

# The tests that read ops() without asserting the warning about the sampled logits.
pytestmark = pytest.mark.filterwarnings("ignore::bitparity.CaptureWarning")
MAPS = ["vllm-qwen3", "sglang-qwen3", "vllm-qwen3-moe", "sglang-qwen3-moe"]
SAMPLED_ONLY = ["entropy.0", "entropy.1", "entropy.2", "logprobs.0", "logprobs.1", "logprobs.2", "ops.logits"]


@pytest.fixture(scope="module")
def hf_models():
    return {"dense": tiny_qwen3.build(tiny_qwen3.dense_config()), "moe": tiny_qwen3.build(tiny_qwen3.moe_config())}


@pytest.fixture(scope="module")
def references(hf_models):
    return {arch: tiny_engines.hf_capture(m).tensors() for arch, m in hf_models.items()}


def arch(name):
    return "moe" if name.endswith("-moe") else "dense"


def engine_of(name, hf_models):
    return Engine(name.split("-")[0], hf_models[arch(name)])


def capture(engine, name_map, schedule=MIXED, **run):
    """The engine's capture of the schedule's calls, as a rollout runs: without autograd."""
    if isinstance(name_map, str):
        name_map = bitparity.NAME_MAPS[name_map]
    with torch.no_grad(), bitparity.capture(engine.model, name_map=name_map) as cap:
        tiny_engines.run(engine, schedule, cap, **run)
    return cap


def assert_same(got, want, names):
    for name in names:
        # float64: a row out of place is off by O(1); the engines' other GEMM shapes round otherwise
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("name", MAPS)
def test_a_mixed_batch_is_the_hf_capture(hf_models, references, name):
    cap = capture(engine_of(name, hf_models), name, pad=1)
    assert cap.sequences() == SEQS
    with pytest.warns(bitparity.CaptureWarning, match=r"ops\.logits: computed for 8 of the capture's 15 rows only"):
        got = cap.tensors()
    want = references[arch(name)]
    # The logits of the sampled rows only: left out with their logprobs, and said.
    assert sorted(set(want) - set(got)) == SAMPLED_ONLY and set(got) <= set(want)
    assert list(got) == [k for k in want if k in got]  # bitparity's execution order
    assert_same(got, want, got)
    assert torch.equal(got["ops.embed"], want["ops.embed"])  # a copy of the same weights
    # Each call's sampled rows: the last token of each sequence's chunk in it.
    sampled = cap.rows_of("logits")
    assert sorted(sampled) == [(0, 2), (0, 4), (1, 1), (1, 2), (2, 3), (2, 4), (2, 5), (2, 6)]
    first = [sum(map(len, SEQS[:s])) for s in range(len(SEQS))]
    assert_same(sampled, {(s, p): want["ops.logits"][first[s] + p] for s, p in sampled}, sampled)
    moe = ["router_weights", "expert_out"] if arch(name) == "moe" else []
    assert json.loads(cap.metadata()["bitparity.not_captured"]) == moe + ["logits"]


@pytest.mark.parametrize("name", MAPS)
def test_logits_of_every_row_give_logprobs(hf_models, references, name):
    """vLLM's compute_logits of every row of the mixed batch; SGLang's LogitsProcessor
    computes each sequence's last token only, so every token decoded on its own."""
    vllm = name.startswith("vllm")
    cap = capture(engine_of(name, hf_models), name, MIXED if vllm else DECODE, every_row=vllm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cap.tensors()
    want = references[arch(name)]
    assert list(got) == list(want)
    assert_same(got, want, want)
    assert "logits" not in cap.metadata().get("bitparity.not_captured", "")


@pytest.mark.parametrize("name", MAPS)
def test_for_model_tells_the_engines_apart(hf_models, name):
    """The classes share Hugging Face's names; their packages (vllm., sglang.) differ."""
    engine = engine_of(name, hf_models)
    assert type(engine.model).__name__ == type(hf_models[arch(name)]).__name__
    with torch.no_grad(), bitparity.capture(engine.model) as cap:
        tiny_engines.run(engine, MIXED[:1], cap)
    assert cap.map is bitparity.NAME_MAPS[name] and cap.metadata()["bitparity.name_map"] == name
    assert bitparity.capture(hf_models[arch(name)]).map["name"] == "hf-qwen3" + ("-moe" if arch(name) == "moe" else "")


def test_row_provider_mistakes_are_named(hf_models):
    engine = engine_of("vllm-qwen3", hf_models)
    ids, pos = torch.tensor(SEQS[0]), torch.arange(len(SEQS[0]))
    seqs = ["a"] * len(SEQS[0])
    with torch.no_grad():
        with bitparity.capture(engine.model, name_map=bitparity.NAME_MAPS["vllm-qwen3"]) as cap:
            engine.batch = SimpleNamespace(seqs=seqs, cache={})
            with pytest.raises(bitparity.CaptureError, match="without cap.rows"):
                engine.model(ids, pos)
            cap.rows(seqs[:-1])
            with pytest.raises(bitparity.CaptureError, match="gave 4 sequence ids for a call of 5 input_ids"):
                engine.model(ids, pos)
            cap.rows(seqs, sampled=[4])
            hidden = engine.model(ids, pos)
            with pytest.raises(bitparity.CaptureError, match=r"logits_processor: 2 rows, but the call has 5 tokens "
                                                             r"and 1 sampled rows"):
                engine.model.compute_logits(hidden[[3, 4]])
            cap.rows(seqs)
            with pytest.raises(bitparity.CaptureError, match="sequence 'a' position 0 is run twice"):
                engine.model(ids, pos)
            rope = engine.model.model.layers[0].self_attn.rotary_emb
            with pytest.raises(bitparity.CaptureError, match=r"a module shared by layers \[0, 1\] ran outside them"):
                rope(pos, torch.zeros(5, 32, dtype=torch.float64), torch.zeros(5, 16, dtype=torch.float64))
    with pytest.raises(bitparity.CaptureError, match="cap.rows\\(\\) is for flat-token maps"):
        bitparity.capture(hf_models["dense"]).rows(seqs)


def test_a_module_that_never_ran_is_named(hf_models):
    """A fused kernel in place of layer 1's q/k norm modules (SGLang's in-place q/k
    norm): their ops are missing, and the warning names the modules."""
    engine = engine_of("vllm-qwen3", hf_models)
    attention = engine.model.model.layers[1].self_attn
    attention._by_head = lambda x, norm: norm.forward(x.view(*x.shape[:-1], -1, attention.head_dim)).view(x.shape)
    cap = capture(engine, "vllm-qwen3")
    with pytest.warns(bitparity.CaptureWarning, match=r"2 module\(s\) it places never ran, so their ops are not in "
                                                      r"the dump: model\.layers\.1\.self_attn\.k_norm, "
                                                      r"model\.layers\.1\.self_attn\.q_norm \("):
        ops = cap.ops()
    assert "ops.layers.0.q_norm" in ops and "ops.layers.1.q_norm" not in ops


def test_wrong_sequence_ids_are_a_difference(hf_models, references):
    """Two sequences' decode tokens swapped in one call's row provider: the capture
    holds other sequences, and its rows differ from Hugging Face's."""
    engine = engine_of("sglang-qwen3", hf_models)
    with torch.no_grad(), bitparity.capture(engine.model, name_map=bitparity.NAME_MAPS["sglang-qwen3"]) as cap:
        for p, call in enumerate(DECODE):
            chunks = [(f"req-{s}", SEQS[s][a:b], a) for s, a, b in call]
            ids = [sid for sid, _, _ in chunks]
            engine.step(chunks, cap, rows=[ids[1], ids[0]] + ids[2:] if p == 1 else ids)
    assert cap.sequences()[0][1] == SEQS[1][1] and cap.sequences()[1][1] == SEQS[0][1]
    got, want = cap.ops(), references["dense"]
    assert not torch.equal(got["ops.embed"], want["ops.embed"])
    assert not torch.allclose(got["ops.layers.1.resid_mlp"], want["ops.layers.1.resid_mlp"])


def _with(name, change):
    """A copy of a built-in map, each entry changed by change(entry)."""
    m = dict(bitparity.NAME_MAPS[name], name="changed")
    m["ops"] = [change(dict(e)) for e in m["ops"]]
    return m


def test_layouts_are_checked(hf_models):
    """The vLLM map on SGLang's [tokens·heads, dim] q/k norm views, and back."""
    for model_map, engine_map, shape in (("vllm-qwen3", "sglang-qwen3", r"\[5, 4, 8\]"),
                                         ("sglang-qwen3", "vllm-qwen3", r"\[20, 8\]")):
        at_fault = r"model\.layers\.0\.self_attn\.q_norm: expected .*got " + shape
        with pytest.raises(bitparity.CaptureError, match=at_fault):
            capture(engine_of(model_map, hf_models), engine_map, [[(0, 0, 5)]])


def test_residual_shift_mistakes(hf_models, references):
    """resid_mlp is the residual sum the next layer's input_layernorm returns. Shifted
    by none, layer 0's norm (called without a residual) has no such output, and says
    so; shifted by two, layer 0's resid_mlp is layer 1's and layer 1's is missing; the
    normed output taken instead of the sum: every resid_mlp differs, all else equal."""
    def shifted(op, index=1):
        def change(e):
            return dict(e, op=op, index=index) if e["op"] == "layers.{i - 1}.resid_mlp" else e
        return _with("vllm-qwen3", change)

    with pytest.raises(bitparity.CaptureError, match=r"model\.layers\.0\.input_layernorm: expected a tensor \(or a "
                                                     r"tuple holding one at 1\), got Tensor"):
        capture(engine_of("vllm-qwen3", hf_models), shifted("layers.{i}.resid_mlp"))

    hf3 = tiny_qwen3.build(tiny_qwen3.dense_config(num_hidden_layers=3))
    got = capture(Engine("vllm", hf3), shifted("layers.{i - 2}.resid_mlp")).ops()
    want = tiny_engines.hf_capture(hf3).ops()
    assert "ops.layers.1.resid_mlp" not in got
    assert not torch.allclose(got["ops.layers.0.resid_mlp"], want["ops.layers.0.resid_mlp"])
    torch.testing.assert_close(got["ops.layers.0.resid_mlp"], want["ops.layers.1.resid_mlp"], rtol=1e-9, atol=1e-9)

    def normed(e):
        return dict(e, index=0) if "resid_mlp" in e["op"] else e
    got, want = capture(engine_of("vllm-qwen3", hf_models), _with("vllm-qwen3", normed)).ops(), references["dense"]
    assert [k for k in got if not torch.allclose(got[k], want[k])] == ["ops.layers.0.resid_mlp", "ops.layers.1.resid_mlp"]


@pytest.mark.parametrize("name", MAPS)
def test_gradients_under_hf_names(hf_models, name):
    """Were gradients ever taken through an engine: qkv_proj, gate_up_proj and the
    stacked experts' w13/w2 split into Hugging Face's parameters (TP 1)."""
    hf = tiny_qwen3.build(hf_models[arch(name)].config)
    with bitparity.capture(hf) as ref:
        for s in SEQS:
            _next_token_loss(hf(torch.tensor([s])).logits[0][:-1], s[1:]).backward()
    engine = Engine(name.split("-")[0], hf)
    with bitparity.capture(engine.model, name_map=bitparity.NAME_MAPS[name]) as cap:
        loss = 0
        for p, logits in enumerate(tiny_engines.run(engine, DECODE, cap)):
            live = [s for s in SEQS if p < len(s)]
            rows = [k for k, s in enumerate(live) if p + 1 < len(s)]
            loss = loss + _next_token_loss(logits[rows], [live[k][p + 1] for k in rows])
        loss.backward()
    got, want = cap.gradients(), ref.gradients()
    assert sorted(got) == sorted(want)
    assert any(".experts.3.down_proj." in k for k in got) == (arch(name) == "moe")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)  # fp32 gradients


def _next_token_loss(logits, targets):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(1, torch.tensor(targets)[:, None]).sum()


def test_the_cli_takes_an_engine_capture(tmp_path):
    """bf16, as engines run: bisect pairs every op of the engine's dump with the Hugging
    Face capture's; the logits of the sampled rows only, and the logprobs and entropy
    from them, are left out as the dump's bitparity.not_captured says."""
    hf = tiny_qwen3.build(tiny_qwen3.moe_config(), dtype=torch.bfloat16)
    trainer, rollout = str(tmp_path / "trainer.safetensors"), str(tmp_path / "rollout.safetensors")
    tiny_engines.hf_capture(hf).write(trainer)
    cap = capture(Engine("sglang", hf), "sglang-qwen3-moe", pad=1)
    with pytest.warns(bitparity.CaptureWarning, match="ops.logits"):
        cap.write(rollout)
    b = bitparity.bisect(rollout, trainer)
    assert b.returncode == 0, b.stdout + b.stderr
    assert "34 tensors in both, compared in execution order\n" in b.stdout
    assert "not compared: 7 op tensor(s) of one side only" in b.stdout
