#!/usr/bin/env python3
"""What Python adds to a quantized training step: the same CIFAR ResNet step (forward,
cross-entropy, backward, SGD with momentum) timed in one process, interleaved round by round,

  cpp_q   the C++ library's model (models::CifarResNet) quantized by nn::quantize_model
  py_q    the same network written in PyTorch, quantized by fp8lab.torch.quantize_model
  py_fp32 the PyTorch network in float32, without fp8lab
  cpp_fp32 the C++ model in float32 (what Python costs PyTorch itself)

and the ratios py_q / cpp_q (goal: below 1.05), py_fp32 / cpp_fp32 and py_q / py_fp32.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py [--depth 20] [--batch 32]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8lab
import fp8lab.torch as ft


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = self.bn_sc = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)
            self.bn_sc = nn.BatchNorm2d(cout)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.shortcut is None else self.bn_sc(self.shortcut(x))
        return F.relu(y + s)


class CifarResNet(nn.Module):
    """models::CifarResNet (src/models/resnet.cpp) in PyTorch: the same layers and order."""

    def __init__(self, depth=20, width=16, classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.stem = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)

        def stage(cin, cout, stride):
            return nn.Sequential(*[Block(cin if i == 0 else cout, cout, stride if i == 0 else 1) for i in range(n)])
        self.stage1 = stage(width, width, 1)
        self.stage2 = stage(width, 2 * width, 2)
        self.stage3 = stage(2 * width, 4 * width, 2)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        y = F.relu(self.bn(self.stem(x)))
        y = self.stage3(self.stage2(self.stage1(y)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class PyStep:
    def __init__(self, model, batch):
        self.model = model
        self.x = torch.randn(batch, 3, 32, 32)
        self.t = torch.randint(0, 10, (batch,))
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(self):
        t0 = time.perf_counter()
        self.opt.zero_grad()
        F.cross_entropy(self.model(self.x), self.t).backward()
        self.opt.step()
        return (time.perf_counter() - t0) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--recipe", default="resnet32-mixed")
    p.add_argument("--compute", default="fp32")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=4, help="steps per variant and round")
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    variants = {
        "cpp_q": fp8lab._core.bench.CppResNetStep(a.depth, a.width, a.batch, a.recipe, a.compute),
        "py_q": PyStep(ft.quantize_model(CifarResNet(a.depth, a.width), a.recipe, compute=a.compute), a.batch),
        "py_fp32": PyStep(CifarResNet(a.depth, a.width), a.batch),
        "cpp_fp32": fp8lab._core.bench.CppResNetStep(a.depth, a.width, a.batch, "fp32", "fp32"),
    }
    times = {k: [] for k in variants}
    for r in range(a.rounds + 1):
        for k, v in variants.items():
            ms = min(v.step() for _ in range(a.steps))
            if r:  # round 0 warms up
                times[k].append(ms)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"CIFAR ResNet-{a.depth} width {a.width}, batch {a.batch}, recipe {a.recipe}, compute {a.compute}, "
          f"{torch.get_num_threads()} threads; median over {a.rounds} rounds of the best of {a.steps} steps")
    for k, v in med.items():
        print(f"  {k:8s} {v:8.2f} ms/step")
    ratio = [x / y for x, y in zip(times["py_q"], times["cpp_q"])]
    print(f"  py_q / cpp_q   {statistics.median(ratio):.3f} (per-round ratios: min {min(ratio):.3f}, "
          f"max {max(ratio):.3f})")
    fp = [x / y for x, y in zip(times["py_fp32"], times["cpp_fp32"])]
    print(f"  py_fp32 / cpp_fp32 {statistics.median(fp):.3f} (min {min(fp):.3f}, max {max(fp):.3f})")
    print(f"  py_q / py_fp32 {med['py_q'] / med['py_fp32']:.3f}")


if __name__ == "__main__":
    main()
