#!/usr/bin/env python3
"""How far each dot-product model (docs/spec.md §7.4) lands from the exact sum: 64x64
outputs of E4M3 operands, uniform on [0, 1) (truncation's bias adds up) and normal (it
cancels), for several reduction lengths; the median and largest relative errors.

    PYTHONPATH=build/python .venv/bin/python bench/dot_model_error.py
"""
import torch

import fp8lab
import fp8lab.torch as ft

MODELS = ["fp32", "hopper-fp8", "hopper-fp8-promote128", "blackwell"] + [
    f"dot:group={g}:frac=13:acc=14" for g in (1, 8, 64)] + [
    "dot:group=32:frac=14:acc=15", "dot:group=32:frac=13:acc=14:acc_round=nearest:align=nearest"]


def errors(a: torch.Tensor, b: torch.Tensor, model: str, scale: torch.Tensor):
    exact = a.double() @ b.double()
    y = ft.matmul(a, b, ft.layer("p", ft.context(accumulate=model))).double()
    rel = (y - exact).abs() / scale
    return rel.median().item(), rel.max().item()


def main() -> None:
    torch.manual_seed(0)
    print("| operands | K | model | median relative error | largest |")
    print("|---|---:|---|---:|---:|")
    for kind in ("uniform", "normal"):
        for k in (512, 4096, 16384):
            draw = torch.rand if kind == "uniform" else torch.randn
            a = fp8lab.quantize(draw(64, k), "e4m3fn")
            b = fp8lab.quantize(draw(k, 64), "e4m3fn")
            # uniform: relative to the exact sum; normal: to the sum of magnitudes (sums cancel)
            scale = (a.double() @ b.double()).abs() if kind == "uniform" else a.double().abs() @ b.double().abs()
            for m in MODELS if k == 4096 else MODELS[:4]:
                med, top = errors(a, b, m, scale)
                print(f"| {kind} | {k} | {m} | {med:.2e} | {top:.2e} |")


if __name__ == "__main__":
    main()
