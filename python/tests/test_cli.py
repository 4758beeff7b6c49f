"""The capture against the `bitparity` CLI ($BITPARITY_EXE, set by CTest): a torch Qwen3
with Hugging Face's module names, its weights written as a checkpoint, captured; the
oracle run on the capture's own tokens; `diff` and `bisect` of the two dumps. The
names, shapes, dtypes and rows of the capture are the oracle's: every tensor is on
both sides, the embedding lookup (a copy of bf16 weights) is bit-identical, and a
torch CPU engine parts from the contract at a named op."""

import json
import os

import pytest
import torch

import bitparity
import tiny_qwen3

SOURCE = os.environ.get("BP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SEQS = [[5, 17, 3, 44, 9, 100, 2], [61, 2, 70, 11]]


def checkpoint(tmp_path, config_json):
    """A Hugging Face checkpoint folder of a tiny_qwen3 model in bf16: the model and its folder."""
    text = dict(config_json)
    cfg = tiny_qwen3.Config(**text)
    cfg.rope_theta = text["rope_parameters"]["rope_theta"]
    model = tiny_qwen3.build(cfg, dtype=torch.bfloat16, seed=3)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(text))
    bitparity.write_dump(str(folder / "model.safetensors"), dict(model.state_dict()))
    return model, str(folder)


@pytest.fixture(scope="module")
def dense_config():
    with open(os.path.join(SOURCE, "fixtures/models/qwen3-dense-tiny/config.json")) as f:
        c = json.load(f)
    c.update(num_hidden_layers=2, layer_types=c["layer_types"][:2], max_window_layers=2, tie_word_embeddings=False)
    return c


def test_executable_is_there():
    assert os.path.exists(bitparity.executable()), "set BITPARITY_EXE to the bitparity binary"


def test_capture_lines_up_with_the_oracle(tmp_path, dense_config):
    model, folder = checkpoint(tmp_path, dense_config)
    engine, oracle = str(tmp_path / "engine.safetensors"), str(tmp_path / "oracle.safetensors")
    with bitparity.capture(model) as cap:
        for s in SEQS:
            model(torch.tensor([s]))
    cap.write(engine)
    _, meta = bitparity.read_dump(engine)
    ran = bitparity.run(oracle, folder, tokens=meta["bitparity.tokens"], contract="bf16-fmaseq-v3", grads=False)
    assert ran.exact, ran.stderr
    d = bitparity.diff(engine, oracle)
    tensors = {t["name"]: t for case in d.report["cases"] for t in case["tensors"]}
    want, _ = bitparity.read_dump(oracle)
    assert sorted(tensors) == sorted(want)
    assert all(t["status"] == "compared" for t in tensors.values()), [t for t in tensors.values() if t["status"] != "compared"]
    assert tensors["ops.embed"]["bit_identical"]
    # Each op judged alone: the ops before the first attention conform, and not every
    # op of the engine is off the contract (bisect's cascade is not conform's verdict).
    c = bitparity.conform(engine, folder, contract="bf16-fmaseq-v3")
    judged = {t["name"]: t["bit_identical"] for case in c.report["cases"] for t in case["tensors"]}
    assert judged["ops.embed"] and judged["ops.layers.0.input_norm"] and judged["ops.layers.0.q_proj"]
    assert 0 < sum(not v for v in judged.values()) < len(judged)
    b = bitparity.bisect(engine, oracle)
    assert b.returncode in (0, 1), b.stderr
    if b.returncode == 1:
        assert b.first_difference.startswith("ops.") and b.first_difference != "ops.embed"
        assert "first difference: " + b.first_difference in b.stdout


def test_bad_input_is_the_clis_message(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"not a dump")
    with pytest.raises(bitparity.BitparityError) as e:
        bitparity.diff(str(tmp_path / "x.safetensors"), str(tmp_path / "x.safetensors"))
    assert e.value.returncode == 2 and "x.safetensors" in str(e.value)


def test_the_installed_copy_is_tested():
    """scripts/test-python installs the package and says where; the tests import that copy."""
    installed = os.environ.get("BITPARITY_INSTALLED")
    if installed is not None:
        assert os.path.dirname(bitparity.__file__) == installed
