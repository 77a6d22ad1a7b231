#!/usr/bin/env python3
"""What Python adds to a quantized training step: the same CIFAR ResNet step (forward,
cross-entropy, backward, SGD with momentum) timed in one process, interleaved round by round,

  cpp_q   the C++ library's model (models::CifarResNet) quantized by nn::quantize_model
  py_q    the same network written in PyTorch, quantized by fp8lab.torch.quantize_model
  py_disp the PyTorch network run inside fp8lab.torch.quantized (the dispatch path)
  py_fp32 the PyTorch network in float32, without fp8lab
  cpp_fp32 the C++ model in float32 (what Python costs PyTorch itself)

and the ratios py_q / cpp_q (goal: below 1.05), py_disp / py_q (goal: below 1.10),
py_fp32 / cpp_fp32 and py_q / py_fp32.

    PYTHONPATH=build/python:build/bench .venv/bin/python bench/bench_python.py [--batch 32] [--compute auto]

--profile: after the timing, torch.profiler over 10 steps of cpp_q and of py_q, the ops by
their own time (where the Python model's extra time goes). --call-cost: what one call of
fp8lab.torch.linear costs in Python beside the C++ binding it calls, on tiny tensors.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import fp8lab
import fp8lab.torch as ft
from interleaved import interleaved
import fp8lab_cpp_step  # bench/cpp_step_module.cpp, built in build/bench
from libtorch_baseline import resnet20  # models::CifarResNet's ResNet-20 in PyTorch


class PyStep:
    def __init__(self, model, batch, context=None):
        self.model, self.context = model, context
        self.x = torch.randn(batch, 3, 32, 32)
        self.t = torch.randint(0, 10, (batch,))
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(self):
        t0 = time.perf_counter()
        self.opt.zero_grad()
        if self.context is None:
            loss = F.cross_entropy(self.model(self.x), self.t)
        else:
            with self.context:
                loss = F.cross_entropy(self.model(self.x), self.t)
        loss.backward()
        self.opt.step()
        return (time.perf_counter() - t0) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--recipe", default="resnet32-mixed")
    p.add_argument("--compute", default="fp32")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=4, help="steps per variant and round")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="then profile 10 steps of cpp_q and py_q")
    p.add_argument("--call-cost", action="store_true", help="then time one fp8lab.torch.linear call")
    a = p.parse_args()
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    disp = resnet20()
    variants = {
        "cpp_q": fp8lab_cpp_step.CppResNetStep(20, 16, a.batch, a.recipe, a.compute),
        "py_q": PyStep(ft.quantize_model(resnet20(), a.recipe, compute=a.compute), a.batch),
        "py_disp": PyStep(disp, a.batch, ft.quantized(disp, a.recipe, compute=a.compute)),
        "py_fp32": PyStep(resnet20(), a.batch),
        "cpp_fp32": fp8lab_cpp_step.CppResNetStep(20, 16, a.batch, "fp32", "fp32"),
    }
    times = interleaved(variants, a.rounds, a.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"CIFAR ResNet-20 width 16, batch {a.batch}, recipe {a.recipe}, compute {a.compute}, "
          f"{torch.get_num_threads()} threads; median over {a.rounds} rounds of the best of {a.steps} steps")
    for k, v in med.items():
        print(f"  {k:8s} {v:8.2f} ms/step")
    ratio = [x / y for x, y in zip(times["py_q"], times["cpp_q"])]
    print(f"  py_q / cpp_q   {statistics.median(ratio):.3f} (per-round ratios: min {min(ratio):.3f}, "
          f"max {max(ratio):.3f})")
    d = [x / y for x, y in zip(times["py_disp"], times["py_q"])]
    print(f"  py_disp / py_q {statistics.median(d):.3f} (min {min(d):.3f}, max {max(d):.3f})")
    fp = [x / y for x, y in zip(times["py_fp32"], times["cpp_fp32"])]
    print(f"  py_fp32 / cpp_fp32 {statistics.median(fp):.3f} (min {min(fp):.3f}, max {max(fp):.3f})")
    print(f"  py_q / py_fp32 {med['py_q'] / med['py_fp32']:.3f}")
    if a.profile:
        for k in ("cpp_q", "py_q"):
            profile(k, variants[k])
    if a.call_cost:
        call_cost()


def profile(name, variant, steps=10):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            variant.step()
    print(f"{name}: {steps} steps, ops by their own time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def call_cost(calls=20000):
    """Microseconds per call of fp8lab.torch.linear and of the binding it ends in."""
    layer = ft.layer("call")
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    for name, f in (("fp8lab.torch.linear", lambda: ft.linear(x, w, None, layer)),
                    ("_core.quant_linear", lambda: fp8lab._core.quant_linear(x, w, None, layer))):
        for _ in range(1000):
            f()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        print(f"  {name:20s} {(time.perf_counter() - t0) / calls * 1e6:.2f} us/call")


if __name__ == "__main__":
    main()
