"""What the PyTorch peers of the benchmarks share: their options, the CUDA-event
timing bench_util.cuh uses (warmup, then the median of --reps), the host time inside
a call (host_us), and the skip (exit
125, the CTest / bisect skip code) where torch or a CUDA GPU is missing."""
import argparse
import statistics
import sys
import time

EXIT_CANNOT_TEST = 125


def parse_timing_args(description, warmup, reps):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--reps", type=int, default=reps)
    args = parser.parse_args()
    if args.warmup < 0 or args.reps < 1:
        parser.error("--warmup must be >= 0 and --reps >= 1")
    return args


def import_torch_with_cuda(name):
    """torch, or None after saying on stderr why `name` is skipped."""
    try:
        import torch
    except ImportError:
        print(f"{name}: torch is not installed: skipped", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA GPU: skipped", file=sys.stderr)
        return None
    return torch


def host_us(torch, call, reps, setup=None):
    """Median host time inside `call`, the GPU idle before each (bench_util.cuh's host_us):
    what the caller waits for the call to return; `setup` (untimed) runs before every call."""
    times = []
    for _ in range(reps):
        if setup:
            setup()
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def median_us(torch, call, warmup, reps, setup=None):
    """Median of `call`'s CUDA-event time; `setup` (untimed) runs before every call."""
    for _ in range(warmup):
        if setup:
            setup()
        call()
    times = []
    for _ in range(reps):
        if setup:
            setup()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)
