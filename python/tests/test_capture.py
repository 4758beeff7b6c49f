"""bitparity.capture on a torch Qwen3 with Hugging Face's module names (tiny_qwen3):
bitparity's op names in execution order, rows in canonical order whatever the batch
(packed, padded left or right, KV-cache decoding), logprobs and gradients, and the
mistakes it refuses."""

import pytest
import torch

import bitparity
import tiny_qwen3

SEQS = [[5, 17, 3, 44, 9], [61, 2, 70], [8, 8, 91, 33, 12, 50, 7]]


def dense_ops(layers):
    per_layer = ["input_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "attn",
                 "attn_out", "resid_attn", "post_norm", "mlp_gate", "mlp_up", "mlp_act", "mlp_out", "resid_mlp"]
    return (["ops.embed"] + [f"ops.layers.{i}.{op}" for i in range(layers) for op in per_layer]
            + ["ops.final_norm", "ops.logits"])


def padded(seqs, left):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for b, s in enumerate(seqs):
        at = slice(width - len(s), width) if left else slice(0, len(s))
        ids[b, at], mask[b, at] = torch.tensor(s), 1
    return ids, mask


def capture_each(model, batches):
    """The capture of `batches`: a function running the model under it."""
    with bitparity.capture(model) as cap:
        batches(model)
    return cap


def extend(m):
    for s in SEQS:
        m(torch.tensor([s]))


def packed(m):
    m(torch.tensor([sum(SEQS, [])]), position_ids=torch.tensor([sum((list(range(len(s))) for s in SEQS), [])]))


def right_padded(m):
    ids, mask = padded(SEQS, left=False)
    m(ids, attention_mask=mask)


def left_padded(m):
    ids, mask = padded(SEQS, left=True)
    m(ids, attention_mask=mask)


def decode(m):
    for s in SEQS:
        out = m(torch.tensor([s[:1]]), use_cache=True)
        for t in s[1:]:
            out = m(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)


def left_padded_decode(m):
    """Prefill the first token of every sequence, then one token a step, left-padded as generate() does."""
    width = max(len(s) for s in SEQS)
    cache, mask = None, torch.zeros(len(SEQS), 0, dtype=torch.long)
    for step in range(width):
        col = [s[step - (width - len(s))] if step >= width - len(s) else 0 for s in SEQS]
        live = [1 if step >= width - len(s) else 0 for s in SEQS]
        mask = torch.cat([mask, torch.tensor(live)[:, None]], dim=1)
        out = m(torch.tensor(col)[:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
        cache = out.past_key_values


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3.build(tiny_qwen3.dense_config())


def test_ops_named_and_ordered_as_bitparity(model):
    cap = capture_each(model, extend)
    ops = cap.ops()
    assert list(ops) == dense_ops(2)
    n = sum(len(s) for s in SEQS)
    c = model.config
    assert ops["ops.embed"].shape == (n, c.hidden_size)
    assert ops["ops.layers.0.q_rope"].shape == (n, c.num_attention_heads * c.head_dim)
    assert ops["ops.layers.0.k_norm"].shape == (n, c.num_key_value_heads * c.head_dim)
    assert ops["ops.logits"].shape == (n, c.vocab_size)
    assert cap.sequences() == SEQS


@pytest.mark.parametrize("batches", [packed, right_padded, left_padded, decode, left_padded_decode])
def test_every_batch_gives_the_same_rows(model, batches):
    want = capture_each(model, extend)
    got = capture_each(model, batches)
    assert got.sequences() == SEQS
    a, b = want.tensors(), got.tensors()
    assert list(a) == list(b)
    for name in a:
        # float64: the batches' different GEMM shapes round differently, a row out of place by O(1)
        torch.testing.assert_close(b[name], a[name], rtol=1e-9, atol=1e-9, msg=name)


def test_a_row_out_of_place_is_seen(model):
    """The negative control of the test above: sequences in another order are other rows."""
    want = capture_each(model, extend)
    got = capture_each(model, lambda m: [m(torch.tensor([s])) for s in reversed(SEQS)])
    assert got.sequences() == list(reversed(SEQS))
    assert not torch.allclose(got.ops()["ops.embed"], want.ops()["ops.embed"])


def test_logprobs_entropy_and_gradients(model):
    model.zero_grad()
    with bitparity.capture(model) as cap:
        for s in SEQS:
            logits = model(torch.tensor([s])).logits[0]
            logp = torch.log_softmax(logits.float(), dim=-1)
            logp[torch.arange(len(s) - 1), torch.tensor(s[1:])].sum().backward()
    t = cap.tensors()
    for n, s in enumerate(SEQS):
        assert t[f"logprobs.{n}"].shape == (len(s) - 1,) and t[f"logprobs.{n}"].dtype == torch.float32
        assert (t[f"logprobs.{n}"] <= 0).all() and (t[f"entropy.{n}"] >= 0).all()
    grads = {k[len("grads."):] for k in t if k.startswith("grads.")}
    assert grads == {name for name, _ in model.named_parameters()}
    assert t["grads.model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32


def test_moe_router_logits(model):
    moe = tiny_qwen3.build(tiny_qwen3.moe_config())
    cap = capture_each(moe, right_padded)
    assert cap.metadata()["bitparity.not_captured"] == '["router_weights", "expert_out"]'
    assert "bitparity.not_captured" not in capture_each(model, extend).metadata()
    ops = cap.ops()
    assert "ops.layers.0.mlp_gate" in ops and "ops.layers.0.router_logits" not in ops  # layer 0: dense
    assert ops["ops.layers.1.router_logits"].shape == (sum(len(s) for s in SEQS), 4)
    torch.testing.assert_close(ops["ops.layers.1.router_logits"], capture_each(moe, extend).ops()["ops.layers.1.router_logits"],
                               rtol=1e-9, atol=1e-9)


def test_dump_round_trip_keeps_bits_and_metadata(model, tmp_path):
    cap = capture_each(model.to(torch.bfloat16), extend)
    model.to(torch.float64)
    path = str(tmp_path / "engine.safetensors")
    cap.write(path)
    tensors, meta = bitparity.read_dump(path)
    want = cap.tensors()
    assert sorted(tensors) == sorted(want)
    for name, t in want.items():
        assert tensors[name].dtype == t.dtype
        assert torch.equal(tensors[name].view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32),
                           t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)), name
    assert meta["bitparity.capture"] == "ops"
    assert meta["bitparity.name_map"] == "hf-qwen3"
    assert '"sequences":[[5,17,3,44,9],[61,2,70],[8,8,91,33,12,50,7]]' in meta["bitparity.tokens"]
    assert meta["bitparity.weights"].startswith("in-memory parameters sha256 ")
    assert '"num_hidden_layers": 2' in meta["bitparity.config"]


def test_mistakes_are_named(model, tmp_path):
    with pytest.raises(ValueError, match="no built-in name map for Linear"):
        bitparity.capture(torch.nn.Linear(2, 2))
    missing = {"name": "mine", "ops": [{"module": "model.nope", "op": "embed", "required": True},
                                       {"module": "model.embed_tokens", "op": "embed"}]}
    with pytest.raises(bitparity.CaptureError, match="name map mine: no module matches model.nope"):
        with bitparity.capture(model, name_map=missing):
            pass
    twice = {"name": "twice", "ops": [{"module": "model.embed_tokens", "op": "embed"},
                                      {"module": "model.layers.{i}.input_layernorm", "op": "embed", "take": "input"}]}
    with pytest.raises(bitparity.CaptureError, match="ops.embed: sequence 0 position 0 captured twice"):
        with bitparity.capture(model, name_map=twice):
            model(torch.tensor([SEQS[0]]))
    with bitparity.capture(model) as cap:
        model(torch.tensor([SEQS[0]]))
        model(torch.tensor([[4]]), attention_mask=torch.ones(1, 10, dtype=torch.long),
              past_key_values=[(torch.zeros(1, 2, 9, 8, dtype=torch.float64),) * 2] * 2)
    with pytest.raises(bitparity.CaptureError, match="sequence 0: position 5 was never captured"):
        cap.ops()
    with pytest.raises(bitparity.DumpError, match="shorter than its 8-byte header"):
        (tmp_path / "short.safetensors").write_bytes(b"abc")
        bitparity.read_dump(str(tmp_path / "short.safetensors"))
    # The hooks are gone after the capture: the model runs as before.
    assert model.forward.__func__ is type(model).forward
