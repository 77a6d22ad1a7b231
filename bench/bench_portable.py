#!/usr/bin/env python3
"""The quantizers as torch operations (backend="torch", fp8lab/_portable.py) against the C++
kernels (backend="kernels") on the same CPU tensors, one thread: what the device-independent
path costs where both run.

    PYTHONPATH=build/python .venv/bin/python bench/bench_portable.py
"""
import statistics
import time

import torch

import fp8lab


def ms(f, repeats=5):
    f()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    vector, matrix = torch.randn(1 << 20), torch.randn(1024, 1024)
    print("one thread; median of 5 calls")
    for fmt, x in (("e4m3fn", vector), ("1.5.2:24", vector), ("mxfp8_e4m3", matrix), ("nvfp4", matrix)):
        k = ms(lambda: fp8lab.quantize(x, fmt, backend="kernels"))
        t = ms(lambda: fp8lab.quantize(x, fmt, backend="torch"))
        print(f"  {fmt:12s} {tuple(x.shape)}: kernels {k:7.2f} ms, torch operations {t:7.1f} ms ({t / k:.0f}x)")


if __name__ == "__main__":
    main()
