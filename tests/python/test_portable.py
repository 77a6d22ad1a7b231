"""The quantizers written as torch operations (fp8lab._portable, backend="torch") against the
C++ kernels (backend="kernels") on the CPU: codes, values, scales, tensor scales and counts
equal for every preset, rounding, overflow mode and scaled format (docs/python.md, "Tensors
on any device"). The torch path is what runs for tensors on CUDA and other devices.

Values compare as bit patterns; a NaN compares as a NaN of the same sign (the bits of a
NaN's payload are the arithmetic's, not the format's).
"""
import numpy as np
import pytest
import torch

import fp8lab
from fp8lab import _arrays, _portable
from format_inputs import boundary_inputs, codes_of, sampled_inputs

ELEMENT_FORMATS = [p["name"] for p in fp8lab.presets()] + [
    "1.4.3:10", "1.5.2:13:ieee", "1.4.3:-3:fn", "1.3.4:2", "1.6.9:31:fn:nosub", "1.4.3:7:fnuz:nosub",
    "1.0.7", "1.0.3:-2:finite", "0.4.3:fn", "0.8.0:fn:nosub:nozero", "1.2.1:1:ieee", "1.7.8:100", "1.5.10",
]
ROUNDINGS = [("nearest-even", 32), ("toward-zero", 32), ("nearest-away", 32), ("stochastic", 32), ("stochastic", 9), ("stochastic", 1)]


def overflows(fmt: fp8lab.Format):
    return ["saturate", "nan"] + (["inf"] if fmt.has_inf else [])


def same_values(want: torch.Tensor, got: torch.Tensor, what: str) -> None:
    """Bit-equal, NaN as NaN of the same sign."""
    assert want.shape == got.shape and want.dtype == got.dtype == torch.float32, what
    wn, gn = torch.isnan(want), torch.isnan(got)
    assert torch.equal(wn, gn), f"{what}: NaN at different places ({int((wn != gn).sum())} of {want.numel()})"
    assert torch.equal(torch.signbit(want), torch.signbit(got)), f"{what}: signs differ"
    wb, gb = want.view(torch.int32)[~wn], got.view(torch.int32)[~gn]
    bad = (wb != gb).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.numel()} values differ, first {want[~wn][bad[0]].item()!r} "
                              f"(kernels) vs {got[~gn][bad[0]].item()!r} (torch)")


def probe(fmt: fp8lab.Format, seed: int) -> torch.Tensor:
    """Every boundary of a format with codes; random float32 bit patterns and specials for wider ones."""
    if fmt.bits <= 16:
        return torch.from_numpy(np.concatenate([boundary_inputs(fmt), sampled_inputs(fmt, 20_000, seed)]))
    bits = np.random.default_rng(seed).integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    f32 = np.finfo(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, f32.max, f32.tiny, f32.smallest_subnormal], np.float32)
    return torch.from_numpy(np.concatenate([bits.view(np.float32), special, -special]))


@pytest.mark.parametrize("name", ELEMENT_FORMATS)
def test_element_formats_every_rounding_and_overflow(name):
    fmt = fp8lab.Format(name)
    x = probe(fmt, seed=len(name))
    for rounding, bits in ROUNDINGS:
        for overflow in overflows(fmt):
            kw = dict(rounding=rounding, overflow=overflow, random_bits=bits, seed=77, return_counts=True)
            what = f"{name} {rounding}/{bits} {overflow}"
            want, wc = fp8lab.quantize(x, fmt, backend="kernels", **kw)
            got, gc = fp8lab.quantize(x, fmt, backend="torch", **kw)
            same_values(want, got, what)
            assert gc == wc, what
            if fmt.bits <= 16:
                wcodes, _ = fp8lab.encode(x, fmt, backend="kernels", **kw)
                gcodes, gcc = fp8lab.encode(x, fmt, backend="torch", **kw)
                assert gcodes.dtype == wcodes.dtype and torch.equal(gcodes, wcodes), what
                assert gcc == wc, what


@pytest.mark.parametrize("name", [n for n in ELEMENT_FORMATS if fp8lab.Format(n).bits <= 16])
def test_every_code_decodes_alike(name):
    fmt = fp8lab.Format(name)
    codes = torch.from_numpy(codes_of(fmt).astype(np.uint8 if fmt.bits <= 8 else np.int16))
    same_values(fp8lab.decode(codes, fmt, backend="kernels"), fp8lab.decode(codes, fmt, backend="torch"), name)


def test_stochastic_streams_are_the_kernels_across_index_blocks():
    """The random bits of element i depend on (seed, i) only; 2^32-element blocks change the key."""
    idx = torch.tensor([0, 1, 2**32 - 1, 2**32, 2**32 + 5, 3 * 2**32 + 7, 2**62 + 11], dtype=torch.int64)
    got = _portable.random_bits(0xDEADBEEF12345678, idx).tolist()
    want = [_reference_bits(0xDEADBEEF12345678, i) for i in idx.tolist()]
    assert got == want


def _reference_bits(seed: int, index: int) -> int:
    """fp8lab/core/random.hpp's random_bits written with Python integers."""
    m64, m32 = (1 << 64) - 1, (1 << 32) - 1

    def mix64(z):
        z = (z + 0x9E3779B97F4A7C15) & m64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    def hash32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & m32
        x ^= x >> 15
        x = (x * 0x846CA68B) & m32
        return x ^ (x >> 16)

    k = mix64(seed ^ mix64(index >> 32))
    return hash32(hash32((index & m32) ^ (k & m32)) ^ (k >> 32))


def scaled_probe(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Groups of every kind: magnitudes from 2^-140 to 2^120, zero rows, a NaN, an Inf, float32
    subnormals and values just below each scale step."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    mag = torch.exp2(torch.randint(-140, 120, (rows, 1), generator=g).float())
    x = x * mag
    x[1] = 0.0
    x[2, 3] = float("nan")
    x[3, 5] = float("-inf")
    x[4] = torch.randn(cols, generator=g) * 1e-42
    x[5, :] = torch.linspace(-448.0, 448.0, cols)
    x[6, :] = -0.0
    return x


SCALED = [p["name"] for p in fp8lab.scaled_presets()] + [
    "e4m3fn@1x32:e8m0:ceil", "e4m3fn@1x32:e8m0:nearest", "e2m1fn@1x16:e8m0:nearest:tensor-scale",
    "e2m1fn@1x16:ue4m3:floor", "e2m1fn@1x16:ue4m3:ceil", "e2m1fn@1x16:ue4m3:floor:tensor-scale",
    "e4m3fn@tensor:fp32:floor", "e4m3fn@tensor:fp32:ceil", "e5m2@line:fp32:nearest", "e4m3fn@4x4:e8m0:floor",
    "e3m2fn@1x7:ue4m3:nearest", "1.4.3:7:fnuz@1x32:e8m0:floor", "1.0.7:finite@line:fp32:ceil",
    "e4m3fn@tensor:e8m0:nearest:delayed-4", "e2m1fn@1x16:ue4m3:nearest:tensor-scale:delayed-8",
    "nvfp4:torchao", "e2m1fn@1x16:ue4m3:nearest:torchao", "e4m3fn@16x16:ue4m3:nearest:tensor-scale:torchao:delayed-4",
    "e4m3_tensor:te", "e5m2@1x32:fp32:nearest:te", "e4m3fn@tensor:fp32:nearest:te:delayed-4",
    "nvfp4:te", "nvfp4_16x16:te", "nvfp4:te:delayed-4",
    "mxfp4:dither-scale", "e4m3fn@4x4:e8m0:ceil:dither-scale", "e2m1fn@line:e8m0:floor:dither-scale",
    "nvfp4_16x16:4over6", "e2m1fn@line:fp32:ceil:4over6", "e2m1fn@1x16:ue4m3:ceil:tensor-scale:4over6:delayed-4",
    "nvfp4_eden:eden-16", "e2m1fn@1x32:ue4m3:nearest:tensor-scale:quartet:eden-64", "e2m1fn@1x8:ue4m3:nearest:tensor-scale:quartet",
]


def _compare_scaled(name, x, delayed_amax=None, rounding="nearest-even", bits=32):
    s = fp8lab.ScaledFormat(name)
    args = (s, rounding, bits, 99, True, True)
    want = fp8lab._core.scaled_quantize_matrix(x, *args, delayed_amax=delayed_amax)
    got = _portable.scaled_quantize_matrix(x, *args, delayed_amax=delayed_amax)
    what = f"{name} {rounding}/{bits} delayed={delayed_amax}"
    same_values(want["values"], got["values"], what)
    assert torch.equal(want["codes"], got["codes"]), what
    if s.scaled:
        assert torch.equal(want["scales"], got["scales"]), what
    assert got["tensor_scale"] == want["tensor_scale"] and got["amax"] == want["amax"], what
    assert got["counts"] == want["counts"], what
    if s.scaled:
        back = (got["codes"], got["scales"].reshape(-1), got["tensor_scale"], s)
        same_values(fp8lab._core.scaled_decode_matrix(*back), _portable.scaled_decode_matrix(*back), what)
    return want


@pytest.mark.parametrize("name", SCALED)
def test_scaled_formats_every_rounding(name):
    x = scaled_probe(37, 70, seed=len(name))
    counted = {}
    # MS-EDEN refuses stochastic elements (its scales are rounded stochastically, docs/spec.md §6.13).
    roundings = ROUNDINGS[:3] + ([] if fp8lab.ScaledFormat(name).eden else [ROUNDINGS[4]])
    for rounding, bits in roundings:
        counted = _compare_scaled(name, x, rounding=rounding, bits=bits)["counts"]
    if fp8lab.ScaledFormat(name).history:
        for amax in (1e-3, 3.5, 1e30):
            _compare_scaled(name, x, delayed_amax=amax)
    assert counted["total"] == x.numel()


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "e4m3fn@1x32:e8m0:nearest", "deepseek_128x128",
                                  "e2m1fn@1x16:ue4m3:ceil", "e4m3fn@tensor:fp32:nearest"])
def test_scaled_groups_at_the_edges_of_the_scale_range(name):
    """Every group's amax at a scale step, a float32 step away, and at the ends of the scale
    formats (scale underflow and overflow are counted alike)."""
    s = fp8lab.ScaledFormat(name)
    top = s.element.max
    steps = [2.0 ** k * m for k in range(-149, 128, 3) for m in (1.0, 1.5, 0.75)]
    amaxes = torch.tensor([v for v in steps if v < 3e38], dtype=torch.float32) * np.float32(top) / 8
    amaxes = torch.cat([amaxes, torch.nextafter(amaxes, torch.tensor(np.inf)), torch.nextafter(amaxes, torch.tensor(0.0))])
    amaxes = amaxes[torch.isfinite(amaxes) & (amaxes > 0)]
    k = s.block if s.granularity in ("block", "tile") else 16
    x = torch.rand(amaxes.numel(), k, generator=torch.Generator().manual_seed(3)) * amaxes[:, None]
    x[:, 0] = amaxes
    counts = _compare_scaled(name, x)["counts"]
    assert counts["groups"] > 0


def test_the_public_functions_take_the_torch_path_on_request_and_off_the_cpu():
    x = torch.randn(4, 64)
    for fmt in ("e4m3fn", "mxfp4", "nvfp4", "1.5.2:24"):
        same_values(fp8lab.quantize(x, fmt, backend="kernels"), fp8lab.quantize(x, fmt, backend="torch"), fmt)
        kernels, torch_ops = fp8lab.encode(x, fmt, backend="kernels"), fp8lab.encode(x, fmt, backend="torch")
        same_values(fp8lab.decode(kernels, fmt, backend="kernels") if not isinstance(kernels, _arrays.ScaledCodes)
                    else fp8lab.decode(kernels, backend="kernels"),
                    fp8lab.decode(torch_ops, fmt, backend="torch") if not isinstance(torch_ops, _arrays.ScaledCodes)
                    else fp8lab.decode(torch_ops, backend="torch"), fmt)
    y = x.clone()
    fp8lab.quantize(y, "mxfp8_e4m3", inplace=True, backend="torch")
    same_values(fp8lab.quantize(x, "mxfp8_e4m3"), y, "in place")
    meta = torch.empty(3, device="meta")
    assert _arrays._ops(meta, "auto", "quantize") is _portable
    assert _arrays._ops(x, "auto", "quantize") is fp8lab._core
    with pytest.raises(TypeError, match="C\\+\\+ kernels work on CPU tensors.*backend='torch'"):
        fp8lab.quantize(meta, "e4m3fn", backend="kernels")
    with pytest.raises(ValueError, match="backend='gpu': expected one of auto, kernels, torch"):
        fp8lab.quantize(x, "e4m3fn", backend="gpu")


def test_the_torch_path_refuses_what_the_kernels_refuse():
    bad = torch.tensor([1, 0xFF], dtype=torch.uint8)
    for backend in ("kernels", "torch"):
        with pytest.raises(ValueError, match="value 255 at index 1 is not a 4-bit code"):
            fp8lab.decode(bad, "e2m1fn", backend=backend)
        with pytest.raises(TypeError, match="expected float32"):
            fp8lab.quantize(torch.ones(3, dtype=torch.float64), "e4m3fn", backend=backend)
        with pytest.raises(ValueError, match="overflow"):
            fp8lab.quantize(torch.ones(3), "e4m3fn", overflow="inf", backend=backend)
        with pytest.raises(ValueError, match="random_bits"):
            fp8lab.quantize(torch.ones(3), "e4m3fn", rounding="stochastic", random_bits=33, backend=backend)
        with pytest.raises(TypeError, match="codes of 1.4.3:fn are uint8, got"):
            fp8lab.decode(torch.ones(3, dtype=torch.int16), "e4m3fn", backend=backend)
