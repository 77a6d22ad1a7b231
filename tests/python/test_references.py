"""fp8lab's encodings against independent references from PyPI (docs/spec.md §2.5):
ml_dtypes' float32 conversions and torch's own low-precision dtypes.

The default run compares every boundary of each format (every value, every midpoint
between neighbours and the float32 numbers on either side of each, the overflow threshold,
zeros, infinities, NaNs) and a few million sampled inputs; `pytest -m exhaustive` (CTest
label exhaustive) compares all 2^32 float32 inputs.

Where a reference's convention differs from fp8lab's, the test names the inputs it leaves
out and checks fp8lab's own rule on them instead (docs/spec.md §2.1):
  - ml_dtypes' conversions have no saturating mode: fp8lab's `saturate` is compared with
    ml_dtypes applied to the input clipped to +-max, which is the same rounding where the
    input is finite.
  - The MX element types (float6_e2m3fn, float6_e3m2fn, float4_e2m1fn) have no NaN:
    ml_dtypes stores NaN as a zero of the sign opposite the NaN's; fp8lab stores +0.
  - float8_e8m0fnu: ml_dtypes gives +-0 its NaN, fp8lab code 0 (2^-127), as for every
    input below 2^-127.
  - torch's float8_e4m3fn conversion saturates and turns +-Inf into +-max, where fp8lab
    keeps an infinity visible as NaN; torch's e5m2 NaN is 0x7f/0xff, fp8lab's 0x7e/0xfe;
    torch's float8_e8m0fnu drops the sign of negative inputs and of -0, and rounds the
    float32 subnormals above 2^-127 up to 2^-126 (fp8lab, like ml_dtypes, to the nearest).
"""

import ml_dtypes
import numpy as np
import pytest
import torch

import fp8lab
from format_inputs import boundary_inputs, sampled_inputs

# fp8lab format, ml_dtypes type, the overflow mode equal to ml_dtypes' conversion.
ML_DTYPES = [
    ("e4m3fn", ml_dtypes.float8_e4m3fn, "nan"),
    ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz, "nan"),
    ("e4m3b11fnuz", ml_dtypes.float8_e4m3b11fnuz, "nan"),
    ("e5m2", ml_dtypes.float8_e5m2, "inf"),
    ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz, "nan"),
    ("e3m4", ml_dtypes.float8_e3m4, "inf"),
    ("1.4.3:7:ieee", ml_dtypes.float8_e4m3, "inf"),
    ("e2m3fn", ml_dtypes.float6_e2m3fn, "nan"),
    ("e3m2fn", ml_dtypes.float6_e3m2fn, "nan"),
    ("e2m1fn", ml_dtypes.float4_e2m1fn, "nan"),
    ("e8m0", ml_dtypes.float8_e8m0fnu, "nan"),
    ("0.5.3:15:fn", ml_dtypes.float8_e5m3fnu, "nan"),
]
IDS = [name for name, _, _ in ML_DTYPES]


def ml_codes(x: np.ndarray, dtype) -> np.ndarray:
    """ml_dtypes' codes of x (a sub-byte type's code in the low bits of its byte)."""
    return x.astype(dtype).view(np.uint8)


def fp8lab_codes(x: np.ndarray, fmt: fp8lab.Format, overflow: str) -> np.ndarray:
    return fp8lab.encode(x, fmt, overflow=overflow).astype(np.uint8)


def left_out(name: str, x: np.ndarray) -> np.ndarray:
    """The inputs whose encoding follows a convention of ml_dtypes' own (module docstring)."""
    if name in ("e2m3fn", "e3m2fn", "e2m1fn"):
        return np.isnan(x)
    if name == "e8m0":
        return x == 0
    return np.zeros(x.shape, bool)


def fp8lab_rule_on_left_out(name: str, fmt: fp8lab.Format, x: np.ndarray, got: np.ndarray) -> None:
    """fp8lab's own rule on the inputs left out: +0 for a NaN in an MX element format, code 0
    (2^-127) for a zero in E8M0."""
    if x.size:
        assert (got == 0).all(), f"{name}: {x[got != 0][:4]} should give code 0"


def assert_same(name, fmt, x, want, got, what):
    bad = np.nonzero(want != got)[0]
    if bad.size:
        i = bad[:8]
        raise AssertionError(
            f"{name} {what}: {bad.size} of {x.size} inputs differ, e.g. "
            + ", ".join(f"{x[k]!r} (bits {x[k:k+1].view(np.uint32)[0]:#010x}): ml_dtypes {want[k]:#04x}, "
                        f"fp8lab {got[k]:#04x}" for k in i))


def check_ml_dtypes(name, dtype, default_mode, x):
    fmt = fp8lab.Format(name)
    skip = left_out(name, x)
    keep = x[~skip]
    # ml_dtypes' own conversion: overflow to NaN (or Inf where the format has it; MX
    # elements saturate).
    got = fp8lab_codes(x, fmt, default_mode)
    assert_same(name, fmt, keep, ml_codes(keep, dtype), got[~skip], f"overflow={default_mode}")
    fp8lab_rule_on_left_out(name, fmt, x[skip], got[skip])
    # Saturating: ml_dtypes on the input clipped to +-max, where the input is finite.
    finite = np.isfinite(x) & ~skip
    top = np.float32(fmt.max)
    lowest = np.float32(-fmt.max if fmt.signed else 0)
    sat = fp8lab_codes(x, fmt, "saturate")
    clipped = np.clip(x[finite], lowest, top)
    if not fmt.signed:  # an unsigned format's NaN for negative inputs, not its lowest value
        clipped = np.where(x[finite] < 0, x[finite], clipped)
    assert_same(name, fmt, x[finite], ml_codes(clipped, dtype), sat[finite], "overflow=saturate")


@pytest.mark.parametrize("name,dtype,mode", ML_DTYPES, ids=IDS)
def test_ml_dtypes_on_every_boundary(name, dtype, mode):
    x = boundary_inputs(fp8lab.Format(name))
    assert x.size > 100
    check_ml_dtypes(name, dtype, mode, x)


@pytest.mark.parametrize("name,dtype,mode", ML_DTYPES, ids=IDS)
def test_ml_dtypes_on_sampled_inputs(name, dtype, mode):
    x = sampled_inputs(fp8lab.Format(name), 1_500_000, seed=len(name))
    check_ml_dtypes(name, dtype, mode, x)


def test_every_ml_dtypes_float_type_is_compared():
    """A float type ml_dtypes adds shows up here until it is compared above."""
    compared = {dtype for _, dtype, _ in ML_DTYPES}
    others = {ml_dtypes.bfloat16}  # 16 bits: fp8lab's bf16 is compared with torch's below
    for n in dir(ml_dtypes):
        if n.startswith("float") and n[5:6].isdigit():
            assert getattr(ml_dtypes, n) in compared | others, f"ml_dtypes.{n} is not compared"


@pytest.mark.exhaustive
@pytest.mark.parametrize("name,dtype,mode", ML_DTYPES, ids=IDS)
def test_ml_dtypes_on_all_float32_inputs(name, dtype, mode):
    step = 1 << 24
    for start in range(0, 1 << 32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        check_ml_dtypes(name, dtype, mode, x)


# ---- torch's dtypes ---------------------------------------------------------------------

# fp8lab format, torch dtype, the overflow mode torch's conversion follows.
TORCH_DTYPES = [
    ("e4m3fn", torch.float8_e4m3fn, "saturate"),
    ("e4m3fnuz", torch.float8_e4m3fnuz, "nan"),
    ("e5m2", torch.float8_e5m2, "inf"),
    ("e5m2fnuz", torch.float8_e5m2fnuz, "nan"),
    ("e8m0", torch.float8_e8m0fnu, "nan"),
]


def torch_codes(x: np.ndarray, dtype) -> np.ndarray:
    return torch.from_numpy(x).to(dtype).view(torch.uint8).numpy()


def torch_left_out(name: str, x: np.ndarray) -> np.ndarray:
    if name == "e4m3fn":
        return np.isinf(x)  # torch: +-max; fp8lab: NaN
    if name == "e5m2":
        return np.isnan(x)  # torch's NaN code is 0x7f/0xff
    if name == "e8m0":  # torch drops the sign; rounds subnormals in (2^-127, 2^-126) up
        return (np.signbit(x) & ~np.isnan(x)) | ((np.abs(x) > 2.0 ** -127) & (np.abs(x) < 2.0 ** -126))
    return np.zeros(x.shape, bool)


@pytest.mark.parametrize("name,dtype,mode", TORCH_DTYPES, ids=[t[0] for t in TORCH_DTYPES])
def test_torch_dtypes(name, dtype, mode):
    fmt = fp8lab.Format(name)
    x = np.concatenate([boundary_inputs(fmt), sampled_inputs(fmt, 500_000, seed=7)])
    skip = torch_left_out(name, x)
    got = fp8lab_codes(x, fmt, mode)
    assert_same(name, fmt, x[~skip], torch_codes(x[~skip], dtype), got[~skip], f"torch, overflow={mode}")
    # Where the conventions differ, both sides still agree on what the value is.
    y, t = fp8lab.decode(got[skip], fmt), torch.from_numpy(x[skip]).to(dtype).float().numpy()
    if name == "e4m3fn":  # +-Inf: fp8lab NaN, torch +-max
        assert np.isnan(y).all() and (np.abs(t) == fmt.max).all()
    if name == "e5m2":  # NaN either way
        assert np.isnan(y).all() and np.isnan(t).all()
    if name == "e8m0":
        # A negative input: fp8lab NaN (code 0 for -0), torch the magnitude's code.
        xs, gs = x[skip], got[skip]
        neg, zero = (xs < 0), (xs == 0)
        assert np.isnan(y[neg]).all() and (gs[zero] == 0).all()
        np.testing.assert_array_equal(torch_codes(xs[neg], dtype), torch_codes(-xs[neg], dtype))
        # The subnormals: torch 2^-126; fp8lab the nearest, as ml_dtypes.
        sub = (np.abs(xs) > 2.0 ** -127) & (np.abs(xs) < 2.0 ** -126) & ~neg
        assert sub.any() and (torch_codes(xs[sub], dtype) == 1).all()
        np.testing.assert_array_equal(gs[sub], ml_codes(xs[sub], ml_dtypes.float8_e8m0fnu))


def test_torch_bfloat16_and_float16():
    """fp8lab's bf16 and fp16 (overflow to Inf) against torch's conversions, which round to
    nearest even and overflow to Inf."""
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        fmt = fp8lab.Format(name)
        x = sampled_inputs(fmt, 1_000_000, seed=3)
        got = fp8lab.encode(x, fmt, overflow="inf").view(np.uint16)
        want = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)
        nan = np.isnan(x)  # the NaN payload is torch's own; fp8lab's is canonical
        np.testing.assert_array_equal(got[~nan], want[~nan])
        assert np.isnan(fp8lab.decode(got[nan], fmt)).all()

