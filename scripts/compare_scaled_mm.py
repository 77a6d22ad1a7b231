#!/usr/bin/env python3
"""Compares the products saved by scripts/gpu/scaled_mm_probe.py (a GPU's torch._scaled_mm)
with fp8lab's dot-product models (docs/spec.md §7.4), case by case: the share of outputs
equal bit for bit, and the largest difference in units of the GPU output's last place.

    PYTHONPATH=build/python .venv/bin/python scripts/compare_scaled_mm.py PROBE.npz [MODEL ...]

MODEL: accumulation names (default: the Hopper presets and variants of their group, width
and rounding, so that the table says which agrees best).
"""
import json
import sys

import numpy as np
import torch

import fp8lab.torch as ft

DEFAULT_MODELS = [
    "hopper-fp8",
    "dot:group=16:frac=13:acc=14",
    "dot:group=64:frac=13:acc=14",
    "dot:group=32:frac=14:acc=15",
    "dot:group=32:frac=13:acc=24",
    "dot:group=32:frac=13:acc=14:acc_round=nearest",
    "blackwell",
    "fp32",
]


def load(path: str):
    data = np.load(path)
    names = sorted({k.rsplit(".", 1)[0] for k in data.files if k != "info"})
    info = json.loads(str(data["info"])) if "info" in data.files else {}
    return info, [(n, data[n + ".a"], data[n + ".b"], data[n + ".out"]) for n in names]


def product(a: np.ndarray, b: np.ndarray, model: str) -> np.ndarray:
    layer = ft.layer("probe", ft.context(accumulate=model))
    return ft.matmul(torch.from_numpy(a), torch.from_numpy(b), layer).numpy()


def ulps(x: np.ndarray, y: np.ndarray) -> float:
    """The largest |x - y| in units of y's last place (float32), 0 where they are equal."""
    spacing = np.spacing(np.abs(y).astype(np.float32))
    d = np.abs(x.astype(np.float64) - y.astype(np.float64)) / spacing
    return float(np.nanmax(d)) if d.size else 0.0


def compare(path: str, models) -> list:
    """Rows (case, model, share equal bit for bit, largest difference in ulps)."""
    _, probes = load(path)
    rows = []
    for name, a, b, out in probes:
        for m in models:
            y = product(a, b, m)
            equal = float(np.mean(y.view(np.uint32) == out.view(np.uint32)))
            rows.append((name, m, equal, ulps(y, out)))
    return rows


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    info, _ = load(sys.argv[1])
    models = sys.argv[2:] or DEFAULT_MODELS
    print("GPU:", json.dumps(info))
    print(f"| case | {' | '.join(models)} |")
    print("|---|" + "---:|" * len(models))
    rows = compare(sys.argv[1], models)
    for case in dict.fromkeys(r[0] for r in rows):
        cells = [f"{100 * e:.1f} % ({u:.0f})" for c, _, e, u in rows if c == case]
        print(f"| {case} | {' | '.join(cells)} |")
    print("(share of outputs equal bit for bit, and in parentheses the largest difference in ulps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
