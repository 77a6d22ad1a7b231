"""The dot-product hardware models (docs/spec.md §7.4) against the definition written in
exact rational arithmetic (fractions.Fraction), independent of the C++ code: a quantized
linear layer's forward product under `accumulate=` a preset or a general model."""
import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

import fp8lab.torch as ft


def _round_to_multiple(x: Fraction, quantum: Fraction, nearest: bool) -> Fraction:
    r = x / quantum
    if nearest:
        k = round(r)  # Python rounds halves to even
    else:
        k = math.trunc(r)
    return k * quantum


def _floor_log2(x: Fraction) -> int:
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def _into_accumulator(s: Fraction, w: int, nearest: bool) -> Fraction:
    if s == 0:
        return Fraction(0)
    qexp = max(_floor_log2(s) - (w - 1), -149)
    v = _round_to_multiple(s, Fraction(2) ** qexp, nearest)
    limit = (2 ** w - 1) * Fraction(2) ** (128 - w)
    if abs(v) > limit:
        return math.copysign(math.inf, v) if nearest else math.copysign(1, v) * limit
    return v


def model_dot(a, b, group, frac, align_nearest, acc_bits, acc_nearest, promote):
    """docs/spec.md §7.4, steps 1-4, for finite operands."""
    acc, outer, since = Fraction(0), np.float32(0), 0
    for start in range(0, len(a), group):
        terms = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[start:start + group], b[start:start + group])]
        terms.append(acc)
        largest = max(abs(t) for t in terms)
        if largest == 0:
            acc = Fraction(0)
        else:
            quantum = Fraction(2) ** (_floor_log2(largest) - frac)
            acc = _into_accumulator(sum(_round_to_multiple(t, quantum, align_nearest) for t in terms), acc_bits,
                                    acc_nearest)
        since += len(terms) - 1
        if promote and (since == promote or start + group >= len(a)):
            outer = np.float32(outer + np.float32(float(acc)))  # one float32 addition
            acc, since = Fraction(0), 0
    return float(outer) if promote else float(acc)


PRESETS = {
    "hopper-fp8": (32, 13, False, 14, False, 0),
    "hopper-fp8-promote128": (32, 13, False, 14, False, 128),
    "blackwell": (32, 25, False, 24, False, 0),
    "ocp-mx": (32, 100, False, 24, True, 32),
    "dot:group=8:frac=5:align=nearest:acc=9:acc_round=nearest:promote=16": (8, 5, True, 9, True, 16),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_linear_layer_sums_as_the_definition(name):
    rng = random.Random(5)
    k = 200
    # Wide exponents, cancellation and a large term beside small ones: the model's rounding shows.
    x = torch.tensor([[rng.gauss(0, 1) * 2.0 ** rng.randint(-12, 12) for _ in range(k)] for _ in range(3)])
    w = torch.tensor([[rng.gauss(0, 1) * 2.0 ** rng.randint(-12, 12) for _ in range(k)] for _ in range(4)])
    x[0, :] = 2.0 ** -14
    x[0, 150] = 1.0
    y = ft.linear(x, w, None, ft.layer("l", ft.context(accumulate=name)))
    want = torch.tensor([[model_dot(x[i].tolist(), w[j].tolist(), *PRESETS[name]) for j in range(4)]
                         for i in range(3)], dtype=torch.float32)
    assert torch.equal(y, want), (y - want).abs().max()
    if name.startswith("hopper"):  # 13 bits lose what float32 keeps
        assert not torch.equal(y, x @ w.t())


def test_bad_model_names_are_value_errors():
    with pytest.raises(ValueError, match="dot model 'dot:frac=101'.*frac 101 is out of range 0..100"):
        ft.context(accumulate="dot:frac=101")
    with pytest.raises(ValueError, match="a dot model, hopper-fp8"):
        ft.context(accumulate="hopper")


def _script(path: str):
    import importlib.util
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, root / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_probes_comparison_finds_the_model_that_made_the_outputs(tmp_path):
    """scripts/compare_scaled_mm.py on a probe file written as the GPU probe writes it, its
    outputs made by hopper-fp8: that model agrees bit for bit, float32 sums do not."""
    probe, compare = _script("scripts/gpu/scaled_mm_probe.py"), _script("scripts/compare_scaled_mm.py")
    cases = probe.cases()
    saved = {"info": np.array('{"device": "made by fp8lab"}')}
    for name in ("random_e4m3_k256", "large_then_small_k256", "small_then_large_k1024", "e5m2"):
        a, b = (t.float().numpy() for t in cases[name])
        saved[name + ".a"], saved[name + ".b"] = a, b
        saved[name + ".out"] = compare.product(a, b, "hopper-fp8")
    path = tmp_path / "probe.npz"
    np.savez_compressed(path, **saved)
    rows = compare.compare(str(path), ["hopper-fp8", "fp32"])
    assert len(rows) == 8
    assert all(equal == 1.0 and ulps == 0 for _, m, equal, ulps in rows if m == "hopper-fp8")
    assert any(equal < 1.0 and ulps > 0 for _, m, equal, ulps in rows if m == "fp32")
