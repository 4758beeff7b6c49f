"""A tensor-parallel engine's capture: two ranks over gloo (processes on the CPU), each a
Megatron-cut shard of one tiny_qwen3 (Hugging Face's module names, or vLLM's and
SGLang's fused qkv_proj and gate_up_proj), captured with tp=(rank, 2); `bitparity merge`
of the two rank dumps gives the TP 1 model's capture: every op and gradient under the
same name and shape, the same values (float64: the all-reduce adds in its own order).
So do the vLLM and SGLang look-alikes (tiny_engines) of a mixed flat batch, their
vocabulary, heads and experts cut as those engines cut them. A map that does not say
what is sharded is caught by the merge."""

import json
import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bitparity
import tiny_engines
import tiny_qwen3

SEQS = [[5, 17, 3, 44, 9], [61, 2, 70]]
WORLD = 2


def run_case(model):
    for s in SEQS:
        logits = model(torch.tensor([s])).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp[torch.arange(len(s) - 1), torch.tensor(s[1:])].sum().backward()


def _rank(rank, store, out, fused, name_map):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        par = tiny_qwen3.Parallel(rank=rank, world=WORLD, fused=fused)
        model = tiny_qwen3.build(tiny_qwen3.dense_config(), par=par)
        with bitparity.capture(model, name_map=name_map, tp=(rank, WORLD)) as cap:
            run_case(model)
            # The trainer's gradient sync: the q/k norms' weights are shared by every
            # head, and each rank saw its own heads only.
            for name, p in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    dist.all_reduce(p.grad)
        cap.write(os.path.join(out, f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def _engine_rank(rank, store, out, name):
    """Rank `rank` of a vLLM or SGLang look-alike running the mixed batch, as a rollout: no autograd."""
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        hf = tiny_qwen3.build(_config(name))
        par = tiny_qwen3.Parallel(rank=rank, world=WORLD, fused=True)
        engine = tiny_engines.Engine(name.split("-")[0], hf, par=par)
        name_map = bitparity.NAME_MAPS[name]
        with torch.no_grad(), bitparity.capture(engine.model, name_map=name_map, tp=(rank, WORLD)) as cap:
            tiny_engines.run(engine, tiny_engines.MIXED, cap, pad=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bitparity.CaptureWarning)  # the logits of sampled rows, left out
            cap.write(os.path.join(out, f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def _config(name):
    return tiny_qwen3.moe_config() if name.endswith("-moe") else tiny_qwen3.dense_config()


def rank_dumps(tmp_path, *args, rank=_rank):
    mp.start_processes(rank, args=(str(tmp_path / "store"), str(tmp_path)) + args, nprocs=WORLD, start_method="fork")
    return [str(tmp_path / f"rank{r}.safetensors") for r in reversed(range(WORLD))]


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    model = tiny_qwen3.build(tiny_qwen3.dense_config())
    with bitparity.capture(model) as cap:
        run_case(model)
    return cap.tensors()


@pytest.mark.parametrize("fused", [False, True])
def test_merged_ranks_are_the_unsharded_capture(tmp_path, tp1, fused):
    name_map = bitparity.NAME_MAPS["fused-qwen3" if fused else "hf-qwen3"]
    dumps = rank_dumps(tmp_path, fused, name_map)
    _, meta = bitparity.read_dump(dumps[0])
    assert meta["bitparity.world"] == "2" and "ops.layers.0.q_proj" in meta["bitparity.shards"]
    merged = str(tmp_path / "merged.safetensors")
    bitparity.merge(merged, dumps)
    got, meta = bitparity.read_dump(merged)
    assert sorted(got) == sorted(tp1)
    for name, want in tp1.items():
        assert got[name].shape == want.shape, name
        torch.testing.assert_close(got[name].to(want.dtype), want, rtol=1e-9, atol=1e-9, msg=name)
    assert "bitparity.rank" not in meta and meta["bitparity.merged"].startswith("2 ranks: ")


def test_a_map_that_hides_its_shards_is_caught(tmp_path):
    """The negative control: without the map's shard marks the ranks' slices look like
    replicated tensors that differ, and the merge refuses them."""
    unmarked = {k: v for k, v in bitparity.NAME_MAPS["hf-qwen3"].items() if k != "grads"}
    unmarked["ops"] = [{k: v for k, v in e.items() if k != "shard"} for e in unmarked["ops"]]
    dumps = rank_dumps(tmp_path, False, unmarked)
    with pytest.raises(bitparity.BitparityError) as e:
        bitparity.merge(str(tmp_path / "merged.safetensors"), dumps)
    assert e.value.returncode == 2
    assert "differs from rank 0's, and bitparity.shards does not shard it" in str(e.value)


@pytest.mark.parametrize("name", ["vllm-qwen3", "sglang-qwen3", "vllm-qwen3-moe", "sglang-qwen3-moe"])
def test_engine_ranks_merge_into_the_hf_capture(tmp_path, name):
    dumps = rank_dumps(tmp_path, name, rank=_engine_rank)
    _, meta = bitparity.read_dump(dumps[0])
    shards = json.loads(meta["bitparity.shards"])
    assert {"ops.layers.0.q_norm", "ops.layers.1.q_rope", "ops.layers.1.attn"} <= set(shards)
    merged = str(tmp_path / "merged.safetensors")
    bitparity.merge(merged, dumps)
    got, meta = bitparity.read_dump(merged)
    want = tiny_engines.hf_capture(tiny_qwen3.build(_config(name))).tensors()
    sampled_only = {k for k in want if k == "ops.logits" or k.startswith(("logprobs.", "entropy."))}
    assert set(got) == set(want) - sampled_only and json.loads(meta["bitparity.not_captured"])[-1] == "logits"
    for k in got:
        assert got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-9, msg=k)
