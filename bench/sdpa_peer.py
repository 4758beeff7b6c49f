#!/usr/bin/env python3
"""The peer of bench_attention: PyTorch SDPA (torch.nn.functional.scaled_dot_product_attention)
on the same Qwen3-30B-A3B attention shapes, bf16, on the device's GPU.

For every case each SDPA backend that accepts it (flash, cuDNN, memory-efficient, math)
is timed and the fastest is reported, named in the `impl` column (sdpa-<backend>).
Timing as bench_attention: CUDA events around each call, warmup, the median of --reps;
peak device memory of the reported backend's calls: torch.cuda.max_memory_allocated,
reset before them, so it counts q, k, v (allocated before, as bench_attention's
inputs are) and what each call allocates.
host_us: the median host time inside one call of the reported backend, the GPU idle before it.
CSV on stdout with bench_attention's columns:
    kind,impl,batch,q_len,kv_len,Hq,Hkv,D,time_us,tflops,bytes,gbps,peak_bytes,host_us
Extend is causal over the whole sequence; decode is one query per sequence attending
to all kv_len cached keys (no mask needed); backward times torch.autograd.grad of a
causal extend's output (dq, dk, dv from a fixed dout, the forward run once before),
with 2.5 times the forward's flops, as bench_attention counts them. GQA goes through enable_gqa=True (no
copy of K/V); a backend that refuses a case is left out of it.
Exit 125 when torch or a CUDA GPU is missing (the CTest / bisect skip code).
"""
import sys

from peer_util import EXIT_CANNOT_TEST, host_us, import_torch_with_cuda, median_us, parse_timing_args

HQ, HKV, D = 32, 4, 128


def cases():
    for batch in (1, 8):
        for t in (1024, 4096):
            yield "extend", batch, t, t
    yield "extend", 1, 16384, 16384
    for batch in (1, 8, 64):
        for cache in (1024, 8192, 32768):
            yield "decode", batch, 1, cache
    for t in (1024, 4096):
        yield "backward", 1, t, t


def backends(torch):
    from torch.nn.attention import SDPBackend

    named = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
             ("math", "MATH")]
    return [(name, getattr(SDPBackend, attr)) for name, attr in named if hasattr(SDPBackend, attr)]


def bench_case(torch, kind, batch, q_len, kv_len, warmup, reps):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + kv_len)
    q = torch.randn(batch, HQ, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, HKV, kv_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, HKV, kv_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    extra = {"enable_gqa": True}  # GQA without copying K/V (torch >= 2.5; the image has 2.11)
    causal = kind != "decode"  # decode: the single query sees every cached key
    backward = kind == "backward"
    if backward:
        for x in (q, k, v):
            x.requires_grad_(True)
        dout = torch.randn_like(q, requires_grad=False)
    best = None
    for name, backend in backends(torch):
        if name == "math" and kv_len * q_len * batch * HQ > (1 << 31):
            continue  # the math backend materialises the score matrix: too large
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)
                if backward:
                    call = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                else:
                    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)
                us = median_us(torch, call, warmup, reps)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
                host = host_us(torch, call, reps)
        except RuntimeError:
            continue  # this backend does not take the case
        if best is None or us < best[1]:
            best = (name, us, peak, host)
    if best is None:
        print(f"sdpa_peer: no SDPA backend ran {kind} batch {batch} kv {kv_len}", file=sys.stderr)
        return
    name, us, peak, host = best
    pairs = batch * q_len * (kv_len - q_len) + batch * q_len * (q_len + 1) / 2
    flops = (10.0 if backward else 4.0) * HQ * D * pairs
    per_side = 4 if backward else 2  # q, o (+ dout, dq) and k, v (+ dk, dv)
    bytes_moved = 2.0 * (per_side * batch * q_len * HQ * D + per_side * batch * kv_len * HKV * D)
    print(f"{kind},sdpa-{name},{batch},{q_len},{kv_len},{HQ},{HKV},{D},{us:.2f},{flops / us * 1e-6:.2f},"
          f"{bytes_moved:.0f},{bytes_moved / us * 1e-3:.1f},{peak},{host:.1f}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()


def main():
    args = parse_timing_args(__doc__.splitlines()[0], warmup=3, reps=20)
    torch = import_torch_with_cuda("sdpa_peer")
    if torch is None:
        return EXIT_CANNOT_TEST
    print(f"sdpa_peer: torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    print("kind,impl,batch,q_len,kv_len,Hq,Hkv,D,time_us,tflops,bytes,gbps,peak_bytes,host_us")
    for kind, batch, q_len, kv_len in cases():
        bench_case(torch, kind, batch, q_len, kv_len, args.warmup, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
