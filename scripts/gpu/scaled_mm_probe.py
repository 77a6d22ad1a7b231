#!/usr/bin/env python3
"""Runs FP8 products on a CUDA GPU with torch._scaled_mm and saves operands and outputs, to be
compared with fp8lab's dot-product models on any machine (scripts/compare_scaled_mm.py,
docs/spec.md §7.4). Needs only torch with CUDA; takes seconds.

    python3 scripts/gpu/scaled_mm_probe.py OUT.npz

The cases (fixed seeds): random E4M3 products for several reduction lengths, and adversarial
ones: a large product beside many small ones (alignment and truncation), long sums of equal
small products after a large one (the accumulator's width, promotion), cancelling pairs,
values just below powers of two, E5M2 operands, and subnormal products.
"""
import json
import sys

import numpy as np
import torch


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def e5m2(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-57344, 57344).to(torch.float8_e5m2)


def cases():
    g = torch.Generator().manual_seed(2026)
    out = {}
    for k in (32, 64, 128, 256, 1024, 4096):
        out[f"random_e4m3_k{k}"] = (e4m3(torch.randn(64, k, generator=g) * 4), e4m3(torch.randn(k, 64, generator=g) * 4))
    for k in (64, 256, 1024):
        a = torch.full((32, k), 2.0 ** -6)
        a[:, 0] = 256.0  # one large product first, then small ones
        a[1::2, :] *= torch.rand(16, k, generator=g) + 0.5
        b = torch.ones(k, 32) * torch.linspace(0.25, 2, 32)
        out[f"large_then_small_k{k}"] = (e4m3(a), e4m3(b))
        a2 = a.flip(1)  # the small ones first
        out[f"small_then_large_k{k}"] = (e4m3(a2), e4m3(b))
    x = torch.randn(32, 256, generator=g) * 16
    x[:, 1::2] = -x[:, 0::2] * 1.0  # cancelling pairs
    x[:, 255] = 0.015625
    out["cancelling_pairs"] = (e4m3(x), e4m3(torch.randn(256, 32, generator=g).sign()))
    p = 2.0 ** torch.randint(-6, 8, (32, 128), generator=g).float()
    out["below_powers_of_two"] = (e4m3(p * 0.9375), e4m3(torch.ones(128, 32) * 0.9375))
    out["e5m2"] = (e5m2(torch.randn(64, 512, generator=g) * 2.0 ** torch.randint(-8, 8, (64, 512), generator=g)),
                   e5m2(torch.randn(512, 64, generator=g)))
    out["subnormal_products"] = (e4m3(torch.randn(32, 128, generator=g) * 2.0 ** -7),
                                 e4m3(torch.randn(128, 32, generator=g) * 2.0 ** -7))
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("scaled_mm_probe: no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    one = torch.ones((), device=dev)
    saved = {}
    for name, (a, b) in cases().items():
        ad = a.to(dev)
        bd = b.to(dev).t().contiguous().t()  # column-major, as _scaled_mm takes its second operand
        y = torch._scaled_mm(ad, bd, scale_a=one, scale_b=one, out_dtype=torch.float32)
        saved[name + ".a"] = a.float().numpy()
        saved[name + ".b"] = b.float().numpy()
        saved[name + ".out"] = y.cpu().numpy()
    info = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "cuda": torch.version.cuda}
    saved["info"] = np.array(json.dumps(info))
    np.savez_compressed(sys.argv[1], **saved)
    print(json.dumps(info), f"{len(saved) // 3} cases ->", sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
