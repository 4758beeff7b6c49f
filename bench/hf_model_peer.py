#!/usr/bin/env python3
"""The peer of bench_model: Hugging Face transformers' own model (Qwen3MoeForCausalLM,
Qwen3ForCausalLM) on the same config, weights and tokens, bf16, SDPA attention and
transformers' grouped-GEMM experts, on the device's GPU; --implementations, in turn on
one model: eager, compile (under torch.compile), patch:CONTRACT (made to compute the
contract's bits by bitparity.patch: fp32 master weights holding the bf16 values, the ops
on optimized/cuda's kernels; it changes the model, so it comes last).

The config is a fixture's (fixtures/models/<name>/config.json) cut to --layers; the
weights are fixtures/hf/generate.py's seeded uniform ones; the tokens are
bench_model's (counter_hash(1000, j) mod vocab). Phases, each the median of --reps
CUDA-event timed runs after --warmup (which includes torch.compile's compilation):
"forward" (the logprobs of the next tokens: logits, float32 log-softmax, gather; the
patched model's own contract logprobs) and "forward+backward" (the gradient of
sum_t c_t * logprob_t for every parameter, c_t = counter_uniform(11, t), as
bench_model's loss; gradients left on the device); not under compile, "decode": one
token for each of --decode-batch sequences after a prefill of --prefill tokens each,
through transformers' DynamicCache (cropped back before every run), with the median host
time of the call beside it (what the caller waits: launches, allocations, the binding).
Peak device memory per phase: torch.cuda.max_memory_allocated, reset before it (weights
included). With --save DIR the model is written there first (save_pretrained), so that
`bench_model --model DIR` times the very same weights. With --profile, one more run of
each phase under torch.profiler: its table of ops by device time and by host time on
stderr (where the time goes, for bench/DECISIONS.md; the CSV is unchanged).
CSV on stdout: phase,layers,tokens,seconds,peak_device_bytes,implementation,host_seconds
Exit 125 when torch, transformers or a CUDA GPU is missing (the CTest / bisect skip code).
"""
import argparse
import json
import os
import sys

from peer_util import EXIT_CANNOT_TEST, host_us, import_torch_with_cuda, median_us

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
TOKEN_SEED, COEF_SEED, WEIGHT_SEED = 1000, 11, 20261122


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b", help="a fixture under fixtures/models")
    ap.add_argument("--layers", type=int, default=4, help="0: the config's own")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--save", help="write the model here (config.json + safetensors) for bench_model --model")
    ap.add_argument("--implementations", default="eager",
                    help="comma-separated, in this order: eager, compile, patch:CONTRACT")
    ap.add_argument("--decode-batch", type=int, default=64, help="sequences of the decode phase (0: none)")
    ap.add_argument("--prefill", type=int, default=64, help="tokens of each sequence before the decode step")
    ap.add_argument("--profile", action="store_true", help="each phase's op table on stderr (torch.profiler)")
    a = ap.parse_args()
    if a.layers < 0 or a.tokens < 2 or a.warmup < 0 or a.reps < 1 or a.decode_batch < 0 or a.prefill < 1:
        ap.error("need --layers >= 0, --tokens >= 2, --warmup >= 0, --reps >= 1, --decode-batch >= 0, --prefill >= 1")
    if not os.path.isfile(os.path.join(FIXTURES, "models", a.model, "config.json")):
        ap.error(f"no fixture named {a.model!r} under fixtures/models")
    a.implementations = a.implementations.split(",")
    rank = [0 if i == "eager" else 1 if i == "compile" else 2 if i.startswith("patch:") else -1
            for i in a.implementations]
    if -1 in rank or rank != sorted(rank):
        ap.error("--implementations: eager, compile, patch:CONTRACT, in this order")
    return a


def build(torch, transformers, a):
    """The model on the CPU and how transformers runs its attention and experts."""
    cfg = transformers.AutoConfig.from_pretrained(os.path.join(FIXTURES, "models", a.model))
    if a.layers:
        cfg.num_hidden_layers = a.layers
    kw = dict(dtype=torch.bfloat16, attn_implementation="sdpa")
    moe = getattr(cfg, "num_experts", 0) > 0
    if moe:  # a dense model refuses the switch
        kw["experts_implementation"] = "grouped_mm"
    model = transformers.AutoModelForCausalLM.from_config(cfg, **kw)
    impl = f"attn={model.config._attn_implementation}"
    if moe:
        impl += f" experts={model.config._experts_implementation}"
    return model, cfg, impl


def prepare(torch, model, eager_forward, how, impl):
    """The GPU model made to run as `how` says; its implementation's name."""
    model.forward = eager_forward
    if how == "compile":
        model.forward = torch.compile(eager_forward)
        return impl + " torch.compile"
    if how.startswith("patch:"):
        import bitparity
        model.zero_grad(set_to_none=True)  # the parameters become fp32
        if not bitparity.ops.has_cuda():
            raise SystemExit("hf_model_peer: this bitparity._C was built without CUDA (python/setup.py)")
        bitparity.patch(model, how[len("patch:"):])
        return f"bitparity.patch {how[len('patch:'):]} (cuda)"
    return impl


def phases(torch, transformers, model, cfg, a, how):
    """(name, call, setup) of each phase timed."""
    from generate import counter_hash, counter_uniform
    ids = torch.tensor([[counter_hash(TOKEN_SEED, j) % cfg.vocab_size for j in range(a.tokens)]], device="cuda")
    coef = torch.tensor([counter_uniform(COEF_SEED, t) for t in range(a.tokens - 1)], device="cuda")

    def logprobs():
        if how.startswith("patch:"):
            return model(ids).logprobs[0]
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
        return torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]

    def forward():
        with torch.no_grad():
            logprobs()

    def forward_backward():
        model.zero_grad(set_to_none=True)
        (coef * logprobs()).sum().backward()

    yield "forward", forward, None
    yield "forward+backward", forward_backward, None
    if a.decode_batch and how != "compile":  # compiled decoding recompiles per cache length
        n, P = a.decode_batch, a.prefill
        prompt = torch.tensor([[counter_hash(TOKEN_SEED + 1 + b, j) % cfg.vocab_size for j in range(P + 1)]
                               for b in range(n)], device="cuda")
        cache = transformers.DynamicCache()
        with torch.no_grad():
            model(prompt[:, :P], past_key_values=cache, use_cache=True)

        def decode():
            with torch.no_grad():
                model(prompt[:, P:], past_key_values=cache, use_cache=True)
        yield "decode", decode, lambda: cache.crop(-1)  # back to the prefill's P columns


def profile(torch, call, setup, title):
    """One more run of a phase under torch.profiler: its ops by device time and by host time."""
    if setup:
        setup()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        call()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"== {title}: by device time", file=sys.stderr)
    print(table.table(sort_by="self_cuda_time_total", row_limit=25), file=sys.stderr)
    print(f"== {title}: by host time", file=sys.stderr)
    print(table.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)


def main():
    a = parse_args()
    torch = import_torch_with_cuda("hf_model_peer")
    if torch is None:
        return EXIT_CANNOT_TEST
    try:
        import transformers
        sys.path.insert(0, os.path.join(FIXTURES, "hf"))
        from generate import init_weights
    except ImportError as e:
        print(f"hf_model_peer: {e}: skipped", file=sys.stderr)
        return EXIT_CANNOT_TEST

    model, cfg, eager_impl = build(torch, transformers, a)
    init_weights(model, WEIGHT_SEED)
    if a.save:
        model.save_pretrained(a.save)
    model = model.to("cuda")
    eager_forward = model.forward
    print("phase,layers,tokens,seconds,peak_device_bytes,implementation,host_seconds")
    for how in a.implementations:
        impl = prepare(torch, model, eager_forward, how, eager_impl)
        for phase, call, setup in phases(torch, transformers, model, cfg, a, how):
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            seconds = median_us(torch, call, a.warmup, a.reps, setup) * 1e-6
            peak = torch.cuda.max_memory_allocated()
            host = f"{host_us(torch, call, a.reps, setup) * 1e-6:.6f}" if phase == "decode" else ""
            tokens = f"{a.decode_batch}x1" if phase == "decode" else a.tokens
            print(f"{phase},{cfg.num_hidden_layers},{tokens},{seconds:.6f},{peak},{impl},{host}", flush=True)
            if a.profile:
                profile(torch, call, setup, f"{impl}, {phase}")
        print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0), "implementation": impl}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
