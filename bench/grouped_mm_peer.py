#!/usr/bin/env python3
"""The peer of bench_moe: torch._grouped_mm (bf16) on the same Qwen3-30B-A3B expert
shapes and the same per-expert row counts, on the device's GPU.

The routing is bench_moe's fixed hash router, regenerated here bit for bit: token t
takes the 8 experts of highest counter_hash(30, t*128 + e) (reference/common/rng.h,
a splitmix64 finaliser; ties to the lower id). The experts' forward is what
moe_experts_fwd computes, in torch's usual grouped form: the tokens' rows gathered
in expert order, one grouped GEMM on the concatenated [gate | up] weights, silu(g)*u,
one grouped GEMM on the down weights, the routing weight applied per row. Its
backward is autograd's through that forward (the gradients of the tokens' rows,
the routing weights and both weight stacks; weight gradients set, not
accumulated), timed alone: each timed backward follows an untimed forward.
Timing as bench_moe: CUDA events around each call, warmup, the median of --reps;
peak device memory: torch.cuda.max_memory_allocated, reset before each case.
CSV on stdout with bench_moe's columns:
    op,impl,tokens,top_k,experts,H,I,rows,rows_max,experts_used,time_us,tflops,peak_bytes
(experts_bwd's flops: twice the forward's, as bench_moe counts them.) Exit 125 when torch, torch._grouped_mm or a CUDA GPU is missing (the CTest / bisect
skip code).
"""
import sys

from peer_util import EXIT_CANNOT_TEST, import_torch_with_cuda, median_us, parse_timing_args

H, I, E, TOP_K = 2048, 768, 128, 8
ROUTER_SEED = 30
TOKENS = (128, 1024, 4096)
MASK = (1 << 64) - 1


def counter_hash(seed, index):
    """reference/common/rng.h counter_hash, in 64-bit unsigned arithmetic."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 0x632BE59BD9B4E019) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def hash_router(tokens):
    """ids[t] = the TOP_K experts of highest hash, ties to the lower id (bench_moe's router)."""
    ids = []
    for t in range(tokens):
        order = sorted(range(E), key=lambda e: (-counter_hash(ROUTER_SEED, t * E + e), e))
        ids.append(order[:TOP_K])
    return ids


def bench_case(torch, tokens, w_gate_up, w_down, warmup, reps):
    import torch.nn.functional as F

    ids = hash_router(tokens)
    counts = [0] * E
    for row in ids:
        for e in row:
            counts[e] += 1
    rows = tokens * TOP_K
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    a = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    topk_w = torch.rand(tokens, TOP_K, device="cuda", dtype=torch.bfloat16, generator=gen)
    flat_ids = torch.tensor(ids, device="cuda", dtype=torch.int64).reshape(-1)
    offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def experts_fwd():
        # the (token, slot) rows in expert order, stable in token order (moe_dispatch's plan)
        order = torch.sort(flat_ids, stable=True).indices
        x = a.index_select(0, order // TOP_K)
        gu = torch._grouped_mm(x, w_gate_up, offs=offs)
        m = F.silu(gu[:, :I]) * gu[:, I:]
        d = torch._grouped_mm(m, w_down, offs=offs)
        c = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
        c[order] = d * topk_w.reshape(-1)[order, None]
        return c

    def report(op, impl, us, flops):
        print(f"{op},{impl},{tokens},{TOP_K},{E},{H},{I},{rows},{max(counts)},"
              f"{sum(1 for c in counts if c > 0)},{us:.2f},{flops / us * 1e-6:.2f},{torch.cuda.max_memory_allocated()}",
              flush=True)

    flops = 2.0 * rows * 3.0 * H * I
    with torch.no_grad():
        us = median_us(torch, experts_fwd, warmup, reps)
    torch.cuda.synchronize()
    report("experts_fwd", "torch-grouped_mm", us, flops)

    torch.cuda.reset_peak_memory_stats()
    leaves = (a, topk_w, w_gate_up, w_down)
    for t in leaves:
        t.requires_grad_(True)
    dout = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    graph = {}

    def forward_for_backward():
        for t in leaves:
            t.grad = None
        graph["c"] = experts_fwd()

    us = median_us(torch, lambda: graph["c"].backward(dout), warmup, reps, setup=forward_for_backward)
    torch.cuda.synchronize()
    report("experts_bwd", "torch-grouped_mm-autograd", us, 2.0 * flops)
    for t in leaves:
        t.requires_grad_(False)
        t.grad = None
    del a, topk_w, flat_ids, offs, dout, graph


def main():
    args = parse_timing_args(__doc__.splitlines()[0], warmup=5, reps=30)
    torch = import_torch_with_cuda("grouped_mm_peer")
    if torch is None:
        return EXIT_CANNOT_TEST
    if not hasattr(torch, "_grouped_mm"):
        print(f"grouped_mm_peer: torch {torch.__version__} has no _grouped_mm: skipped", file=sys.stderr)
        return EXIT_CANNOT_TEST
    print(f"grouped_mm_peer: torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    gen = torch.Generator(device="cuda").manual_seed(0)
    # nn.Linear layouts ([E][2I][H] and [E][H][I]) seen as [E][K][N] column-major per
    # expert, the layout _grouped_mm takes without a copy.
    w_gate_up = (torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02).transpose(1, 2)
    w_down = (torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02).transpose(1, 2)
    print("op,impl,tokens,top_k,experts,H,I,rows,rows_max,experts_used,time_us,tflops,peak_bytes")
    for tokens in TOKENS:
        bench_case(torch, tokens, w_gate_up, w_down, args.warmup, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
