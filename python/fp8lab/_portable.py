"""The quantizers as plain torch operations, for tensors on any device (docs/spec.md §2, §6).

The C++ kernels run on the CPU. The functions here compute the same codes, values, scales and
counts from the same definitions with torch's integer and float64 operations, so they run
wherever torch runs (CUDA included) and agree with the kernels bit for bit (tests/python/
test_portable.py checks every preset, rounding and scaled format on the CPU).
fp8lab.quantize, encode and decode take this path for tensors that are not on the CPU, or
when asked with backend="torch".

Every figure of a format (largest code, NaN codes, the decoded values) is derived here from
the format's fields, not read from the C++ library: the agreement is a check, not a copy.
Integers are int64 tensors that never overflow (32-bit products are taken in 16-bit halves);
the scale arithmetic is float64, exact where docs/spec.md §6.2 says it is, in the same
order of operations as the reference.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from . import _core

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_FLT_MAX_BITS = 0x7F7FFFFF
_FLT_MAX = float(np.finfo(np.float32).max)
_QNAN_BITS = 0x7FC00000


# ---- formats -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fmt:
    """A Format's fields and the figures docs/spec.md §1 derives from them."""
    E: int
    M: int
    bias: int
    policy: str
    subnormals: bool
    sign: bool
    zero: bool

    @staticmethod
    def of(f: "_core.Format") -> "Fmt":
        return Fmt(f.exp_bits, f.man_bits, f.bias, f.policy, f.subnormals, f.signed, f.zero)

    @property
    def width(self) -> int:
        return int(self.sign) + self.E + self.M

    @property
    def sign_bit(self) -> int:
        return 1 << (self.width - 1) if self.sign else 0

    @property
    def mag_mask(self) -> int:
        return (1 << (self.E + self.M)) - 1

    @property
    def max_code(self) -> int:
        every = self.mag_mask
        if self.policy in ("fnuz", "finite"):
            return every
        if self.policy == "fn":
            return max(every - 1, 0)
        return 0 if self.E == 0 else (((1 << self.E) - 1) << self.M) - 1  # ieee

    @property
    def has_nan(self) -> bool:
        return self.policy != "finite"

    @property
    def has_inf(self) -> bool:
        return self.policy == "ieee"

    @property
    def signed_zero(self) -> bool:
        return self.sign and self.zero and self.policy != "fnuz"

    @property
    def signed_nan(self) -> bool:
        return self.sign and self.policy in ("fn", "ieee")

    def emin(self, bias):
        return 1 - bias if self.subnormals else -bias

    def nan_code(self, negative: bool) -> int:
        s = self.sign_bit if negative else 0
        if self.policy == "fnuz":
            return self.sign_bit
        if self.policy == "fn":
            return s | self.mag_mask
        if self.policy == "ieee":
            return s | (((1 << self.E) - 1) << self.M) | (1 << (self.M - 1))
        return 0

    def inf_code(self, negative: bool) -> int:
        return (self.sign_bit if negative else 0) | (((1 << self.E) - 1) << self.M)

    def magnitude(self, c: int) -> float:
        """The value of magnitude code c, exactly (a double)."""
        M, e, m = self.M, c >> self.M, c & ((1 << self.M) - 1)
        if self.E == 0 or (self.subnormals and e == 0):
            return float(np.ldexp(float(m), 1 - self.bias - M))
        if c == 0:
            return 0.0 if self.zero else float(np.ldexp(1.0, -self.bias))
        return float(np.ldexp(float((1 << M) + m), e - self.bias - M))

    @property
    def max_finite(self) -> float:
        return self.magnitude(self.max_code)


@dataclasses.dataclass(frozen=True)
class Spec:
    """An element quantizer: a format, its rounding, overflow and random bits (canonical names)."""
    fmt: Fmt
    rounding: str = "nearest-even"
    overflow: str = "saturate"
    random_bits: int = 32


def spec(format: "_core.Format", rounding: str, overflow: str, random_bits: int) -> Spec:
    """The element quantizer, its names checked and made canonical by the C++ library's parser."""
    r, o, bits = _core.quant_spec(format, rounding, overflow, random_bits)
    return Spec(Fmt.of(format), r, o, bits)


def _require_device(device: torch.device) -> None:
    """The device can hold values and compute in float64 (TypeError otherwise)."""
    if device.type == "meta":
        raise TypeError("fp8lab: a tensor on the meta device holds no values to quantize or decode")
    if device.type == "mps":
        raise TypeError("fp8lab's torch quantizers need float64 arithmetic for exact scales, which MPS lacks; "
                        "move the tensor to the CPU")


# ---- random bits (fp8lab/core/random.hpp) ----------------------------------------------

def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x < 2^32, in int64 without overflow: x's halves multiplied apart."""
    return ((x & 0xFFFF) * c + (((x >> 16) * (c & 0xFFFF)) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_bits(seed: int, index: torch.Tensor) -> torch.Tensor:
    """The 32 random bits of each element index of the stream `seed` (int64 tensor of indices)."""
    lo, hi = index & _M32, index >> 32
    highs = torch.unique(hi).tolist() if index.numel() and int(hi.max()) != int(hi.min()) else \
        [int(hi.reshape(-1)[0])] if index.numel() else [0]
    k0 = torch.zeros_like(index)
    k1 = torch.zeros_like(index)
    for h in highs:
        k = _mix64(seed ^ _mix64(h))
        sel = hi == h
        k0 = torch.where(sel, k & _M32, k0)
        k1 = torch.where(sel, k >> 32, k1)
    return _hash32(_hash32(lo ^ k0) ^ k1)


# ---- the element codec (docs/spec.md §2) ------------------------------------------------

def _shl(x: torch.Tensor, s) -> torch.Tensor:
    return torch.bitwise_left_shift(x, s)


def _shr(x: torch.Tensor, s) -> torch.Tensor:
    return torch.bitwise_right_shift(x, s)


def _stochastic_up(top_r: torch.Tensor, q: Spec, rbits: torch.Tensor) -> torch.Tensor:
    """1 iff F_R + r_R >= 2^R (docs/spec.md §2.2)."""
    R = q.random_bits
    return _shr(top_r + _shr(rbits, 32 - R), R)


def _round_quanta(sig: torch.Tensor, drop: torch.Tensor, q: Spec, rbits) -> torch.Tensor:
    """sig rounded to a multiple of 2^drop, in units of 2^drop (drop >= 0; from 60 on every
    24-bit sig behaves as at 64)."""
    d = drop.clamp(max=60)
    trunc = _shr(sig, d)
    rem = sig & (_shl(torch.ones_like(sig), d) - 1)
    if q.rounding == "toward-zero":
        return trunc
    if q.rounding == "nearest-even":
        half = _shl(torch.ones_like(sig), (d - 1).clamp(min=0))
        up = (d > 0) & ((rem > half) | ((rem == half) & ((trunc & 1) == 1)))
        return trunc + up.to(sig.dtype)
    if q.rounding == "nearest-away":
        half = _shl(torch.ones_like(sig), (d - 1).clamp(min=0))
        return trunc + ((d > 0) & (rem >= half)).to(sig.dtype)
    R = q.random_bits
    top = torch.where(d <= R, _shl(rem, (R - d).clamp(min=0)), _shr(rem, (d - R).clamp(min=0)))
    return trunc + _stochastic_up(top, q, rbits)


def _below_minpos(sig, xe, bias, q: Spec, rbits):
    """Subnormals off, zero on: (whether |x| < minpos = 2^-b (1 + 2^-M), its code 0 or 1)."""
    M = q.fmt.M
    d = (1 << M) + 1
    s = xe + bias + M
    pos = s >= 0
    below = torch.where(pos, (s <= 30) & (_shl(sig, s.clamp(0, 30)) < d),
                        (-s >= 40) | (sig < _shl(torch.full_like(sig, d), (-s).clamp(0, 39))))
    if q.rounding == "toward-zero":
        code = torch.zeros_like(sig)
    elif q.rounding == "nearest-even":
        s1 = s + 1
        code = torch.where(s1 >= 0, _shl(sig, s1.clamp(0, 30)) > d,
                           (-s1 < 40) & (sig > _shl(torch.full_like(sig, d), (-s1).clamp(0, 39)))).to(sig.dtype)
    elif q.rounding == "nearest-away":
        s1 = s + 1
        code = torch.where(s1 >= 0, _shl(sig, s1.clamp(0, 30)) >= d,
                           (-s1 < 40) & (sig >= _shl(torch.full_like(sig, d), (-s1).clamp(0, 39)))).to(sig.dtype)
    else:
        sr = s + q.random_bits
        num = torch.where(sr >= 0, _shl(sig, sr.clamp(0, 38)), torch.where(-sr >= 64, 0, _shr(sig, (-sr).clamp(0, 63))))
        code = _stochastic_up(num // d, q, rbits)
    return below, code


def _normalise(a: torch.Tensor):
    """|x| = sig 2^xe with sig in [2^23, 2^24), float32 subnormals included (a: the bits of |x|, > 0)."""
    exf = a >> 23
    sub = exf == 0
    _, e2 = torch.frexp(a.to(torch.float32))  # a subnormal's bits as an integer: exact in float32
    s = (24 - e2.to(torch.int64)).clamp(0, 24)
    sig = torch.where(sub, _shl(a, s), (a & 0x7FFFFF) | 0x800000)
    xe = torch.where(sub, -149 - s, exf - 150)
    return sig, xe


def encode(x: torch.Tensor, q: Spec, index: torch.Tensor, seed: int, bias=None):
    """The codes (int64) of float32 x, and the masks of overflow, underflow and NaN of each
    element. `index`: each element's stochastic-rounding index; `bias`: the format's bias, or a
    tensor of biases (the power-of-two scales of MX formats shift it per group)."""
    f = q.fmt
    b = f.bias if bias is None else bias
    bits = x.contiguous().view(torch.int32).to(torch.int64) & _M32
    neg = (bits >> 31) == 1
    a = bits & 0x7FFFFFFF
    rbits = random_bits(seed, index) if q.rounding == "stochastic" else None
    sign = torch.where(neg, f.sign_bit, 0)

    is_nan = a > 0x7F800000
    is_inf = a == 0x7F800000
    none = torch.zeros_like(neg)
    below_range = (neg & (a != 0) & ~is_nan) if not f.sign else none  # below an unsigned format's range
    sig, xe = _normalise(torch.where(a == 0, 1, a))
    zero_in = (a == 0) | ((xe + 23 < -b) if not f.zero else none)  # without zero: below 2^-bias

    ex = xe + 23
    emin = f.emin(b)
    et = torch.maximum(ex, torch.as_tensor(emin, device=x.device))
    n = _round_quanta(sig, et - f.M - xe, q, rbits)
    mag = torch.where(ex < emin, n, _shl((et + b).clamp(min=0), f.M) + n - (1 << f.M))
    if not f.subnormals and f.zero:
        below, code01 = _below_minpos(sig, xe, b, q, rbits)
        mag = torch.where(below, code01, mag)

    nan_code = torch.where(neg, f.nan_code(True), f.nan_code(False)) if f.has_nan else torch.zeros_like(a)
    signed_max = sign | f.max_code
    zero_code = sign if f.signed_zero else torch.zeros_like(a)
    overflowed = mag > f.max_code
    if q.overflow == "saturate" or (q.overflow == "nan" and not f.has_nan) or \
            (q.overflow == "inf" and not f.has_inf and not f.has_nan):
        over_code, over_nan = signed_max, False
    elif q.overflow == "inf" and f.has_inf:
        over_code, over_nan = torch.where(neg, f.inf_code(True), f.inf_code(False)), False
    else:
        over_code, over_nan = nan_code, True
    underflowed = (mag == 0) & f.zero

    code = sign | mag
    code = torch.where(underflowed, zero_code, code)
    code = torch.where(overflowed, over_code, code)
    code = torch.where(zero_in, zero_code, code)
    if f.has_inf:
        inf_code = torch.where(neg, f.inf_code(True), f.inf_code(False))
    else:
        inf_code = nan_code if f.has_nan else signed_max
    code = torch.where(is_inf, inf_code, code)
    code = torch.where(below_range, f.nan_code(False) if f.has_nan else 0, code)
    code = torch.where(is_nan, nan_code, code)

    normal_path = ~(is_nan | is_inf | below_range | zero_in)
    m_over = is_inf | below_range | (normal_path & overflowed)
    m_under = normal_path & ~overflowed & underflowed
    if not f.zero:
        m_under = m_under | (zero_in & ~is_nan & ~is_inf & ~below_range)
    m_nan = is_nan | (normal_path & overflowed & over_nan)
    if f.has_nan:
        m_nan = m_nan | below_range | ((is_inf & ~below_range) if not f.has_inf else none)
    return code, m_over, m_under, m_nan


def _magnitudes(mag: torch.Tensor, f: Fmt, bias) -> torch.Tensor:
    """The exact values (float64) of magnitude codes under `bias` (an int or a tensor)."""
    M = f.M
    e, m = mag >> M, (mag & ((1 << M) - 1)).to(torch.float64)
    b = torch.as_tensor(bias, device=mag.device)
    sub = (e == 0) if f.subnormals else torch.zeros_like(e, dtype=torch.bool)
    if f.E == 0:
        sub = torch.ones_like(sub)
    low = torch.ldexp(m, (1 - b - M).to(torch.float64).expand_as(m))
    norm = torch.ldexp(m + (1 << M), (e - b - M).to(torch.float64))
    if not f.zero:
        norm = torch.where(mag == 0, torch.ldexp(torch.ones_like(m), (-b).to(torch.float64).expand_as(m)), norm)
    elif not f.subnormals:
        norm = torch.where(mag == 0, 0.0, norm)
    return torch.where(sub, low, norm)


def _nan_of(bits_neg: torch.Tensor) -> torch.Tensor:
    """Quiet NaNs as float32, negative where bits_neg."""
    return torch.where(bits_neg, _QNAN_BITS | (1 << 31), _QNAN_BITS).to(torch.int64)


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 tensor of int64 bit patterns (< 2^32)."""
    return torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)


def _bits(v: torch.Tensor) -> torch.Tensor:
    return v.contiguous().view(torch.int32).to(torch.int64) & _M32


def decode(codes: torch.Tensor, f: Fmt, bias=None) -> torch.Tensor:
    """float32 values of int64 codes (NaN codes: quiet NaN, signed where the policy says)."""
    b = f.bias if bias is None else bias
    neg = (codes & f.sign_bit) != 0 if f.sign else torch.zeros_like(codes, dtype=torch.bool)
    mag = codes & f.mag_mask
    e, m = mag >> f.M, mag & ((1 << f.M) - 1)
    if f.policy == "fnuz":
        nan = codes == f.sign_bit
        inf = torch.zeros_like(nan)
    elif f.policy == "fn":
        nan, inf = mag == f.mag_mask, torch.zeros_like(neg)
    elif f.policy == "ieee":
        ones = e == (1 << f.E) - 1
        nan, inf = ones & (m != 0), ones & (m == 0)
    else:
        nan = inf = torch.zeros_like(neg)
    v = _magnitudes(torch.where(nan | inf, 0, mag), f, b).to(torch.float32)
    v = torch.where(inf, torch.inf, v)
    v = torch.where(neg, -v, v)
    return torch.where(nan, _from_bits(_nan_of(neg & f.signed_nan)), v)


def quantize_values(x: torch.Tensor, codes: torch.Tensor, q: Spec, bias=None) -> torch.Tensor:
    """The fake-quantized values of x from its codes: decode(encode(x)), except that NaN stays
    a NaN with x's sign in a format without NaN (docs/spec.md §2.3)."""
    y = decode(codes, q.fmt, bias)
    return y if q.fmt.has_nan else torch.where(torch.isnan(x), _nan_result(x, q.fmt), y)


def _nan_result(x: torch.Tensor, f: Fmt) -> torch.Tensor:
    """quantize(x) where x is NaN: the format's NaN, or (a format without NaN) x's sign on a quiet NaN."""
    negative = (_bits(x) >> 31) == 1
    return _from_bits(_nan_of(negative & f.signed_nan if f.has_nan else negative))


def _counts(total: int, over, under, nan) -> Dict[str, int]:
    return {"total": total, "overflow": int(over.sum()), "underflow": int(under.sum()), "nan": int(nan.sum())}


def _indices(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
    return torch.arange(offset, offset + t.numel(), device=t.device, dtype=torch.int64).reshape(t.shape)


def _require(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{what}: expected float32 values, got {str(t.dtype).replace('torch.', '')}")
    _require_device(t.device)


def _require_codable(f: Fmt, format) -> None:
    if f.width > 16:
        raise _core.Error(f"format {format} is {f.width} bits wide: codes and kernels take at most 16 bits "
                          "(E + M <= 15)")


# The functions fp8lab.quantize, encode and decode call, with the signatures of fp8lab._core's.

def quantize_tensor(t: torch.Tensor, format: "_core.Format", rounding: str, overflow: str, random_bits: int,
                    seed: int, inplace: bool) -> Tuple[torch.Tensor, Dict[str, int]]:
    """Fake quantization of a float32 tensor; element i (row-major) draws stream index i."""
    _require(t, "quantize")
    q = spec(format, rounding, overflow, random_bits)
    codes, o, u, n = encode(t, q, _indices(t), seed)
    y = quantize_values(t.contiguous(), codes, q).reshape(t.shape)
    if inplace:
        t.copy_(y)
        y = t
    return y, _counts(t.numel(), o, u, n)


def encode_tensor(t: torch.Tensor, format: "_core.Format", rounding: str, overflow: str, random_bits: int,
                  seed: int) -> Tuple[torch.Tensor, Dict[str, int]]:
    """The codes of a float32 tensor: uint8 up to 8 bits wide, int16 (uint16's bits) up to 16."""
    _require(t, "encode")
    q = spec(format, rounding, overflow, random_bits)
    _require_codable(q.fmt, format)
    codes, o, u, n = encode(t, q, _indices(t), seed)
    out = codes.to(torch.uint8) if q.fmt.width <= 8 else \
        torch.where(codes >= 1 << 15, codes - (1 << 16), codes).to(torch.int16)
    return out.reshape(t.shape), _counts(t.numel(), o, u, n)


def check_codes(codes: torch.Tensor, f: Fmt, format, what: str) -> torch.Tensor:
    """The codes as int64, refusing one with a bit above the format's width, as the kernels do."""
    c = codes.to(torch.int64) & (0xFF if codes.dtype == torch.uint8 else 0xFFFF)
    if f.width < 8 * codes.element_size():
        bad = (c >> f.width) != 0
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise _core.Error(f"{what}: value {int(c.reshape(-1)[i])} at index {i} is not a {f.width}-bit code of "
                              f"{format}")
    return c


def decode_tensor(codes: torch.Tensor, format: "_core.Format") -> torch.Tensor:
    f = Fmt.of(format)
    _require_codable(f, format)
    want = torch.uint8 if f.width <= 8 else torch.int16
    if codes.dtype != want:
        raise TypeError(f"decode: codes of {format} are {'uint8' if f.width <= 8 else 'uint16'}, got "
                        f"{str(codes.dtype).replace('torch.', '')}")
    _require_device(codes.device)
    return decode(check_codes(codes, f, format, "decode"), f)


# ---- scales (docs/spec.md §6.2) ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Scaled:
    """A ScaledFormat's fields."""
    element: Fmt
    granularity: str
    block: int
    scale: str
    rule: str
    tensor_scale: bool
    history: int
    arithmetic: str = "exact"
    four_over_six: bool = False
    dither_scale: bool = False
    eden: int = 0

    @staticmethod
    def of(s: "_core.ScaledFormat") -> "Scaled":
        return Scaled(Fmt.of(s.element), s.granularity, s.block, s.scale_format, s.rule, s.tensor_scale, s.history,
                      s.arithmetic, s.four_over_six, s.dither_scale, s.eden)

    @property
    def pow2(self) -> bool:
        """Scales are powers of two applied as a shift of the element bias."""
        return self.scale == "e8m0" and not self.tensor_scale and not self.dither_scale


def _dither_scaled(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """dither-scale's element before rounding (docs/spec.md §6.11): fl32(3 x) * 2^-(e+2), one
    float32 rounding (2^-(e+2) is a float32 value for every E8M0 exponent)."""
    three_x = x * torch.full_like(x, 3.0)
    return three_x * torch.pow(2.0, -(exponent + 2).to(torch.float64)).to(torch.float32)


def _dither_value(q: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """dither-scale's value, fl32(fl32(q * 2^(e+2)) / 3): the product exact in float64, then
    rounded (or overflowed) to float32, then divided by 3 in float32."""
    p = (q.to(torch.float64) * torch.pow(2.0, (exponent + 2).to(torch.float64))).to(torch.float32)
    return torch.div(p, torch.full_like(p, 3.0))


# Four Over Six (docs/spec.md §6.10): the second element value a group's amax is scaled to,
# and the largest block scale its tensor scale leaves room for.
_FOUR_OVER_SIX_TARGET = 4.0
_FOUR_OVER_SIX_SCALE_TOP = 256.0

# The scale formats with 8-bit codes, as formats (docs/spec.md §6.1).
_SCALE_FORMATS = {
    "e8m0": Fmt(8, 0, 127, "fn", False, False, False),
    "ue4m3": Fmt(4, 3, 7, "fn", True, False, True),
}


@functools.lru_cache(maxsize=None)
def _scale_values(kind: str) -> Tuple[float, ...]:
    f = _SCALE_FORMATS[kind]
    return tuple(f.magnitude(c) for c in range(f.max_code + 1))


def _scale_max_value(kind: str) -> float:
    return float(np.finfo(np.float32).max) if kind == "fp32" else _scale_values(kind)[-1]


def _scale_max_code(kind: str) -> int:
    return _FLT_MAX_BITS if kind == "fp32" else _SCALE_FORMATS[kind].max_code


def _scale_nan_code(kind: str) -> int:
    return _QNAN_BITS if kind == "fp32" else _SCALE_FORMATS[kind].nan_code(False)


def _scale_value(kind: str, code: torch.Tensor) -> torch.Tensor:
    """The exact value (float64) of scale codes in 0..max."""
    if kind == "fp32":
        return _from_bits(code).to(torch.float64)
    table = torch.tensor(_scale_values(kind), dtype=torch.float64, device=code.device)
    return table[code]


def _te_two_level(s: Scaled) -> bool:
    return s.arithmetic == "te" and s.tensor_scale


def _te_encode(s: Scaled, tensor_amax: float) -> np.float32:
    """TransformerEngine's global encode factor E = fl32(max_e * 448 / amax): float32's largest
    where that is infinite (amax 0 included), 1 where it is 0 (docs/spec.md §6.9)."""
    top = np.float32(s.element.max_finite * _scale_max_value(s.scale))
    with np.errstate(divide="ignore", over="ignore"):
        e = top / np.float32(tensor_amax)
    e = min(e, np.float32(_FLT_MAX))
    return np.float32(1) if e == 0 else np.float32(e)


def tensor_scale_of(s: Scaled, tensor_amax: float) -> float:
    """The float32 second-level scale from the tensor's amax (docs/spec.md §6.3; te's
    arithmetic: TransformerEngine's global decode scale fl32(1 / E), §6.9)."""
    if _te_two_level(s):
        return float(np.float32(1) / _te_encode(s, tensor_amax))
    if not s.tensor_scale or not tensor_amax > 0:
        return 1.0
    if s.arithmetic == "quartet":
        top, m = _quartet_constants(s)
        ts = np.float32(np.float32(tensor_amax) / top) / m
        return float(max(ts, np.float32(np.finfo(np.float32).smallest_subnormal)))
    top = s.element.max_finite * (_FOUR_OVER_SIX_SCALE_TOP if s.four_over_six else _scale_max_value(s.scale))
    ts = np.float32(float(tensor_amax) / top)
    return float(max(ts, np.finfo(np.float32).tiny))


def _quartet_constants(s: Scaled) -> Tuple[np.float32, np.float32]:
    """core quartet_constants (docs/spec.md §6.13): the largest block scale the tensor scale
    leaves room for and the element value a block's amax maps to, as float32."""
    if s.eden == 0:
        return np.float32(448.0), np.float32(6.0)
    return np.float32(255.99), np.float32(6.0 / (17.0 / 16.0 * 0.93))


def _quartet_scale_code(s: Scaled, amax: torch.Tensor, ts: float):
    """Quartet II's block scale codes of finite amaxes (docs/spec.md §6.13): ue4m3 of
    fl32(fl32(amax / m) / ts) to nearest-even, saturating, and the code of 1 where that is 0.
    (code, underflow, overflow)."""
    f = _SCALE_FORMATS[s.scale]
    _, m = _quartet_constants(s)
    q = torch.minimum(amax.to(torch.float32) / m / np.float32(ts), torch.tensor(_FLT_MAX))
    zeros = torch.zeros_like(q, dtype=torch.int64)
    code, _, _, _ = encode(q, Spec(f), zeros, 0)
    one, _, _, _ = encode(torch.ones_like(q), Spec(f), zeros, 0)
    return torch.where(code == 0, one, code), (code == 0) & (amax != 0), q > _scale_values(s.scale)[-1]


def _ilogb_float(v: float) -> int:
    """floor(log2 v) of a positive finite float."""
    return int(np.frexp(v)[1]) - 1


def _ilogb(v: torch.Tensor) -> torch.Tensor:
    """floor(log2 v) of positive finite float64 values."""
    return torch.frexp(v)[1].to(torch.int64) - 1


def _pow2(k: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(k, dtype=torch.float64), k.to(torch.float64))


def _e8m0_code(s: Scaled, amax: torch.Tensor, max_e: float, emax: int):
    """E8M0 scales without a tensor scale, by exponent arithmetic: (code, underflow, overflow)."""
    if s.rule == "floor":
        e = _ilogb(amax) - emax
    else:
        e = _ilogb(amax) - _ilogb_float(max_e)
        for _ in range(2):
            e = torch.where(torch.ldexp(torch.full_like(amax, max_e), e.double()) > amax, e - 1, e)
        for _ in range(2):
            e = torch.where(torch.ldexp(torch.full_like(amax, max_e), (e + 1).double()) <= amax, e + 1, e)
        lo = torch.ldexp(torch.full_like(amax, max_e), e.double())
        up = (lo != amax) & ((s.rule == "ceil") | (2 * amax > 3 * lo) | ((2 * amax == 3 * lo) & ((e & 1) == 0)))
        e = e + up.to(torch.int64)
    under, over = e < -127, e > 127
    code = torch.where(under, 0, torch.where(over, 254, e + 127))
    return code, under, over


def _floor_log2_ratio(amax: torch.Tensor, ts: float) -> torch.Tensor:
    """floor(log2(amax / ts)), exactly."""
    k = _ilogb(amax / ts)
    tsd = torch.full_like(amax, ts)
    for _ in range(2):
        k = torch.where(torch.ldexp(tsd, k.double()) > amax, k - 1, k)
    for _ in range(2):
        k = torch.where(torch.ldexp(tsd, (k + 1).double()) <= amax, k + 1, k)
    return k


def _last_code_le(kind: str, limit: torch.Tensor, weight: float, ts: float) -> torch.Tensor:
    """The largest scale code c with value(c) * ts * weight <= limit (float64, evaluated in that
    order), or -1 where none is. weight 1 and ts 1 give the largest value <= limit."""
    if kind != "fp32":
        t = torch.tensor(_scale_values(kind), dtype=torch.float64, device=limit.device) * ts * weight
        return torch.searchsorted(t, limit.contiguous(), right=True) - 1
    # float32 codes: start from the nearest float and walk a step or two, as the reference does.
    c = _bits(torch.nan_to_num((limit / (ts * weight)).to(torch.float32), posinf=float(np.finfo(np.float32).max)))
    c = c.clamp(max=_FLT_MAX_BITS)

    def le(code):
        return _from_bits(code).to(torch.float64) * ts * weight <= limit

    for _ in range(3):
        c = torch.where(~le(c) & (c > 0), c - 1, c)
    for _ in range(3):
        c = torch.where((c < _FLT_MAX_BITS) & le((c + 1).clamp(max=_FLT_MAX_BITS)), c + 1, c)
    return torch.where(le(c), c, -1)


def _scale_code(s: Scaled, amax: torch.Tensor, ts: float, target: Optional[float] = None):
    """The rule's scale code of positive finite amaxes (float64), scaled to element value `target`
    (None: the element format's largest): (code, underflow, overflow)."""
    max_e = target if target is not None else s.element.max_finite
    emax = _ilogb_float(max_e)
    if s.scale == "e8m0" and ts == 1:
        return _e8m0_code(s, amax, max_e, emax)
    top = _scale_max_code(s.scale)
    if s.rule == "floor":
        target = _pow2(_floor_log2_ratio(amax, ts) - emax)
        c = _last_code_le(s.scale, target, 1.0, 1.0)
        none = c < 0
        c = c.clamp(min=0)
        over = ~none & (target > _scale_max_value(s.scale))
        under = none | (_scale_value(s.scale, c) == 0)
        return c, under, over
    c = _last_code_le(s.scale, amax, max_e, ts)
    none = c < 0
    c = c.clamp(min=0)
    exact = _scale_value(s.scale, c) * ts * max_e >= amax
    at_top = ~exact & (c == top)
    lo, hi = c, (c + 1).clamp(max=top)
    if s.rule == "nearest":
        twice = 2 * amax
        mid = (_scale_value(s.scale, lo) + _scale_value(s.scale, hi)) * ts * max_e
        pick = torch.where(twice < mid, lo, torch.where(twice > mid, hi, torch.where(lo % 2 == 0, lo, hi)))
    else:
        pick = hi
    code = torch.where(none, 0, torch.where(exact | at_top, c, pick))
    moved = ~none & ~exact & ~at_top
    under = none | (moved & (_scale_value(s.scale, code) == 0))
    return code, under, at_top


def _torchao_scale_code(s: Scaled, amax: torch.Tensor, ts: float):
    """torchao's NVFP4 scale codes of finite amaxes (docs/spec.md §6.9): fl32(fl32(amax / max_e)
    / ts) clamped to the scale format's normal range, rounded to nearest-even. (code,
    underflow, overflow); a zero amax gets the least normal too, not counted."""
    f = _SCALE_FORMATS[s.scale]
    values = _scale_values(s.scale)
    least, top = values[1 << f.M], values[-1]
    q = amax.to(torch.float32) / np.float32(s.element.max_finite) / np.float32(ts)
    clamped = q.clamp(min=least, max=top)
    code, _, _, _ = encode(clamped, Spec(f), torch.zeros_like(clamped, dtype=torch.int64), 0)
    return code, (q < least) & (amax != 0), q > top


def _te_scale(s: Scaled, amax: torch.Tensor):
    """TransformerEngine's current-scaling factors of finite amaxes (docs/spec.md §6.9): S =
    fl32(max_e / amax), float32's largest where that overflows (a scale underflow), 1 for a
    zero amax; the scale X = fl32(1 / S). (S, X, underflow)."""
    a = amax.to(torch.float32)
    # torch.div of two tensors: `number / tensor` would multiply by the reciprocal, rounding twice.
    S = torch.where(a == 0, 1.0, torch.div(torch.tensor(s.element.max_finite, dtype=torch.float32), a))
    under = torch.isinf(S)
    S = torch.where(under, torch.tensor(_FLT_MAX, dtype=torch.float32), S)
    return S, torch.reciprocal(S), under


def _te_nvfp4_scale(s: Scaled, amax: torch.Tensor, encode_factor: np.float32, ts: float):
    """TransformerEngine's NVFP4 block scale codes of finite amaxes (docs/spec.md §6.9): the
    code of min(fl32(amax * fl32(E * fl32(1 / max_e))), float32's largest) clamped to the scale
    format's largest and rounded to nearest-even; elements are x times r = fl32(1 / X) (float32's
    largest where that is infinite). (code, underflow, overflow, r)."""
    f = _SCALE_FORMATS[s.scale]
    top = _scale_values(s.scale)[-1]
    multiplier = np.float32(encode_factor * (np.float32(1) / np.float32(s.element.max_finite)))
    q = torch.minimum(amax.to(torch.float32) * torch.tensor(float(multiplier), dtype=torch.float32),
                      torch.tensor(_FLT_MAX))
    clamped = q.clamp(max=top)
    code, _, _, _ = encode(clamped, Spec(f), torch.zeros_like(clamped, dtype=torch.int64), 0)
    value = (_scale_value(s.scale, code) * ts).to(torch.float32)
    r = torch.reciprocal(value)
    r = torch.where(torch.isinf(r), torch.tensor(_FLT_MAX, dtype=torch.float32), r)
    return code, (code == 0) & (amax != 0), q > top, r


@dataclasses.dataclass
class _Groups:
    code: torch.Tensor      # scale codes (int64)
    value: torch.Tensor     # float32: the scale times the tensor scale
    exponent: torch.Tensor  # e8m0: log2 of the value
    nan: torch.Tensor
    zero: torch.Tensor
    reciprocal: Optional[torch.Tensor] = None  # torchao's and te's arithmetic: elements are x times it


def _choose_scales(s: Scaled, amax: torch.Tensor, ts: float, target: Optional[float] = None,
                   te_encode: Optional[np.float32] = None) -> Tuple[_Groups, torch.Tensor, torch.Tensor]:
    """choose_scale of float32 group amaxes (NaN: the group holds NaN or Inf), with the masks
    of scale underflow and overflow; `target`: the element value amaxes are scaled to (None:
    the largest); `te_encode`: TransformerEngine's E, which te's two-level scales need."""
    a = amax.to(torch.float64)
    nan = ~torch.isfinite(a) | (a < 0)
    zero = ~nan & (a == 0)
    live = ~nan & ~zero
    reciprocal = None
    if _te_two_level(s):
        if te_encode is None:
            raise _core.Error("te's NVFP4 block scales are formed from TransformerEngine's global encode factor, "
                              "which this tensor scale lacks (docs/spec.md §6.9)")
        code, under, over, reciprocal = _te_nvfp4_scale(s, torch.where(nan, 0.0, a), te_encode, ts)
    elif s.arithmetic == "te":
        S, X, under = _te_scale(s, torch.where(nan, 1.0, a))
        code, over, reciprocal = _bits(X), torch.zeros_like(under), S
    elif s.arithmetic == "quartet":
        code, under, over = _quartet_scale_code(s, torch.where(nan, 1.0, a), ts)
        code = torch.where(nan, 0, code)
    elif s.arithmetic == "torchao":
        code, under, over = _torchao_scale_code(s, torch.where(nan, 1.0, a), ts)
        code = torch.where(nan, 0, code)
        scale = _scale_value(s.scale, code).to(torch.float32)
        reciprocal = (1.0 / torch.tensor(ts, dtype=torch.float32)) / scale
    else:
        code, under, over = _scale_code(s, torch.where(live, a, 1.0), ts, target)
        code = torch.where(live, code, 0)
    under, over = under & live, over & live
    value = (_scale_value(s.scale, code) * ts).to(torch.float32)
    code = torch.where(nan, _scale_nan_code(s.scale), code)
    value = torch.where(nan, torch.nan, value)
    exponent = code - 127 if s.scale == "e8m0" else torch.zeros_like(code)
    return _Groups(code, value, exponent, nan, zero, reciprocal), under, over


def _layout(s: Scaled, rows: int, cols: int) -> Tuple[int, int]:
    """Values per group along the rows and the columns (fp8lab::block_layout)."""
    if s.granularity == "tensor":
        return max(rows, 1), max(cols, 1)
    if s.granularity == "line":
        return 1, max(cols, 1)
    if s.granularity == "block":
        return 1, s.block
    return s.block, s.block


def _grid(t: torch.Tensor, br: int, bc: int, fill) -> torch.Tensor:
    """A [rows, cols] matrix as [grid rows, br, grid cols, bc], padded with `fill`."""
    rows, cols = t.shape
    gr, gc = -(-rows // br), -(-cols // bc)
    p = torch.nn.functional.pad(t, (0, gc * bc - cols, 0, gr * br - rows), value=fill) if \
        (gr * br, gc * bc) != (rows, cols) else t
    return p.reshape(gr, br, gc, bc)


def _spread(g: torch.Tensor, br: int, bc: int, rows: int, cols: int) -> torch.Tensor:
    """Per-group values [grid rows, grid cols] broadcast to the elements of the matrix."""
    return g.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]


def _finite_amax(x: torch.Tensor) -> float:
    a = torch.where(torch.isfinite(x), x.abs(), 0.0)
    return float(a.max()) if a.numel() else 0.0


def _elements(x: torch.Tensor, s: Scaled, q: Spec, g: _Groups, index: torch.Tensor, seed: int, each):
    """The elements of x under group scales g (each: a group tensor spread to the elements):
    codes, overflow, underflow, NaN masks and values, as quantize_group gives them."""
    e_nan, e_value, e_zero = each(g.nan), each(g.value), each(g.zero)
    x_nan = torch.isnan(x)
    el = q.fmt
    qnan = _nan_result(x, el)  # quantize(x, element) of a NaN x
    if s.pow2:
        bias = el.bias - each(g.exponent)
        c, o, u, n = encode(x, q, index, seed, bias)
        u = u.to(torch.int64)
        y = torch.where(x_nan, qnan, decode(c, el, bias))
    else:
        # A zero group, or a scale that underflowed to 0 (te's arithmetic multiplies by its r there).
        zero_scale = e_zero if g.reciprocal is not None else (e_value == 0) | e_zero
        if g.reciprocal is not None:  # torchao's and te's arithmetic: x times the group's r
            v = x * torch.where(zero_scale | e_nan, 1.0, each(g.reciprocal))
        elif s.dither_scale:
            v = _dither_scaled(x, each(g.exponent))
        else:
            v = x / torch.where(zero_scale | e_nan, 1.0, e_value)
        v = _saturate_scaled(v, x)
        signed_zero = torch.where(torch.signbit(x), -0.0, 0.0)
        c, o, u, n = encode(torch.where(zero_scale, signed_zero, v), q, index, seed)
        # The quotient's own underflow (x / scale == 0 in float32) counts beside the element's.
        u = torch.where(zero_scale, (x != 0) & ~x_nan, u).to(torch.int64) + (~zero_scale & (v == 0) & (x != 0))
        o = o & ~zero_scale
        n = torch.where(zero_scale, x_nan, n)
        d = decode(c, el)
        scaled = _dither_value(d, each(g.exponent)) if s.dither_scale else d * e_value
        y = torch.where(zero_scale, torch.where(x_nan, qnan, d * 0.0), torch.where(x_nan, qnan * e_value, scaled))
    nan_code = el.nan_code(False) if el.has_nan else 0
    c = torch.where(e_nan, nan_code, c)
    y = torch.where(e_nan, torch.nan, y)
    o, u = o & ~e_nan, torch.where(e_nan, 0, u)
    n = n | e_nan
    return c, o, u, n, y


def _group_error(x: torch.Tensor, y: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """Four Over Six's error of each group (docs/spec.md §6.10): (y - x)^2 summed in float64 in
    the group's row-major order, [grid rows, grid cols]."""
    d = (y.to(torch.float64) - x.to(torch.float64)) ** 2
    d = torch.where(torch.isnan(d), 0.0, d)  # groups with NaN keep their scale for 6 anyway
    grid = _grid(d, br, bc, 0.0).permute(0, 2, 1, 3)
    grid = grid.reshape(grid.shape[0], grid.shape[1], -1)
    total = torch.zeros(grid.shape[:2], dtype=torch.float64, device=x.device)
    for k in range(grid.shape[2]):
        total = total + grid[:, :, k]
    return total


def _saturate_scaled(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """core saturate_scaled: a finite x whose quotient v lies past float32's range saturates
    (docs/spec.md §6.3); only an infinite x stays infinite."""
    return torch.where(torch.isinf(v) & torch.isfinite(x), torch.copysign(torch.tensor(_FLT_MAX), v), v)


def _quartet_scaled(x: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """The quartet arithmetic's scaled elements fl32(x / X): signed zeros where X is 0 (a scale
    that underflowed), float32's largest of x's sign where a finite x overflows."""
    v = torch.where(X == 0, torch.where(torch.signbit(x), -0.0, 0.0), x / torch.where(X == 0, 1.0, X))
    return _saturate_scaled(v, x)


def _eden_scales(x: torch.Tensor, s: Scaled, g: _Groups, d: torch.Tensor, index: torch.Tensor, seed: int, each):
    """MS-EDEN's scales (docs/spec.md §6.13): per window of s.eden values of a row, c =
    fl32(num) / fl32(den) with num = sum v^2 and den = sum v q summed in float64 in order (1
    where den is 0 or c is not finite); each finite group's scale fl32(s c) rounded
    stochastically to UE4M3 with the random bits of its first element's index. (codes, the
    groups whose new scale is 0, those whose s c passed 448.)"""
    rows, cols = x.shape
    e_nan = each(g.nan)
    v = torch.where(e_nan, 0.0, _quartet_scaled(x, each(g.value))).to(torch.float64)
    q = torch.where(e_nan, 0.0, d).to(torch.float64)
    vg, qg = _grid(v, 1, s.eden, 0.0)[:, 0], _grid(q, 1, s.eden, 0.0)[:, 0]  # [rows, windows, eden]
    num = torch.zeros(vg.shape[:2], dtype=torch.float64, device=x.device)
    den = torch.zeros_like(num)
    for k in range(s.eden):
        num = num + vg[:, :, k] * vg[:, :, k]
        den = den + vg[:, :, k] * qg[:, :, k]
    num32, den32 = num.to(torch.float32), den.to(torch.float32)
    c = torch.where(den32 == 0, 1.0, num32 / torch.where(den32 == 0, 1.0, den32))
    c = torch.where(torch.isfinite(c), c, 1.0)
    groups = g.code.shape[1]
    c_g = c[:, torch.arange(groups, device=x.device) * s.block // s.eden]
    t = _scale_value(s.scale, torch.where(g.nan, 0, g.code)).to(torch.float32) * c_g
    first = index[:, ::s.block] if cols else torch.zeros_like(g.code)
    code, _, _, _ = encode(t.contiguous(), Spec(_SCALE_FORMATS[s.scale], "stochastic"), first, seed)
    code = torch.where(g.nan, g.code, code)
    return code, (code == 0) & ~g.zero & ~g.nan, (t > _scale_values(s.scale)[-1]) & ~g.nan


def _eden_values(x: torch.Tensor, s: Scaled, g: _Groups, c: torch.Tensor, ts: float, index: torch.Tensor,
                 seed: int, under: torch.Tensor, over: torch.Tensor, each):
    """MS-EDEN's groups and values (docs/spec.md §6.13): the scales corrected, the values
    fl32(fl32(q s) ts). (groups, values, scale underflow, overflow)."""
    d = decode(c, s.element)
    code, under_e, over_e = _eden_scales(x, s, g, d, index, seed, each)
    g = dataclasses.replace(g, code=code)
    under, over = under | under_e, over | over_e
    unit = _scale_value(s.scale, torch.where(g.nan, 0, g.code)).to(torch.float32)
    y = (d * each(unit)) * torch.tensor(ts, dtype=torch.float32, device=x.device)
    return g, torch.where(each(g.nan), torch.nan, y), under, over


def scaled_quantize_matrix(x: torch.Tensor, format: "_core.ScaledFormat", rounding: str, random_bits: int,
                           seed: int, values: bool, codes: bool, delayed_amax: Optional[float] = None) -> dict:
    """scaled_quantize_reference of a float32 matrix: the values, codes, scale codes ([grid
    rows, grid cols], int32), tensor scale, current amax and counts, as the C++ binding gives them."""
    _require(x, "quantize")
    q = spec(format.element, rounding, "saturate", random_bits)
    s = Scaled.of(format)
    rows, cols = x.shape
    current = _finite_amax(x)
    index = _indices(x)
    if codes and s.element.width > 8:
        raise _core.Error(f"codes of scaled formats take elements of at most 8 bits ({format.element})")
    if not format.scaled:
        c, o, u, n = encode(x, q, index, seed)
        return {"values": quantize_values(x, c, q) if values else None,
                "codes": c.to(torch.uint8) if codes else None,
                "scales": torch.zeros(0, 0, dtype=torch.int32, device=x.device), "tensor_scale": 1.0,
                "amax": current, "counts": _counts(x.numel(), o, u, n)}
    delayed = s.history > 0 and delayed_amax is not None and delayed_amax > 0
    tensor_amax = float(np.float32(delayed_amax)) if delayed else current
    ts = tensor_scale_of(s, tensor_amax)
    te_encode = _te_encode(s, tensor_amax) if _te_two_level(s) else None
    br, bc = _layout(s, rows, cols)
    grid = _grid(x, br, bc, 0.0)
    finite = torch.isfinite(grid)
    amax = torch.where(finite, grid.abs(), 0.0).amax(dim=(1, 3)) if grid.numel() else \
        torch.zeros(grid.shape[0], grid.shape[2], device=x.device)
    nonfinite = (~finite).any(dim=(1, 3)) if grid.numel() else torch.zeros_like(amax, dtype=torch.bool)
    from_history = delayed and s.granularity == "tensor"
    group_amax = torch.full_like(amax, tensor_amax) if from_history else torch.where(nonfinite, torch.nan, amax)
    g, s_under, s_over = _choose_scales(s, group_amax, ts, te_encode=te_encode)

    def each(t):
        return _spread(t, br, bc, rows, cols)

    c, o, u, n, y = _elements(x, s, q, g, index, seed, each)
    if s.eden:
        g, y, s_under, s_over = _eden_values(x, s, g, c, ts, index, seed, s_under, s_over, each)
    if s.four_over_six:
        g4, under4, over4 = _choose_scales(s, group_amax, ts, _FOUR_OVER_SIX_TARGET)
        c4, o4, u4, n4, y4 = _elements(x, s, q, g4, index, seed, each)
        four = (_group_error(x, y4, br, bc) < _group_error(x, y, br, bc)) & ~g.nan & ~g.zero
        g = _Groups(*(torch.where(four, b, a) for a, b in
                      ((g.code, g4.code), (g.value, g4.value), (g.exponent, g4.exponent), (g.nan, g4.nan),
                       (g.zero, g4.zero))))
        s_under, s_over = torch.where(four, under4, s_under), torch.where(four, over4, s_over)
        e4 = each(four)
        c, o, u, n, y = (torch.where(e4, b, a) for a, b in ((c, c4), (o, o4), (u, u4), (n, n4), (y, y4)))
    saturated = _grid(o.to(torch.int64), br, bc, 0).sum(dim=(1, 3)) > 0 if o.numel() else torch.zeros_like(g.nan)
    counts = _counts(x.numel(), o, u, n)
    counts.update(groups=g.code.numel(), saturated_groups=int(saturated.sum()), nan_groups=int(g.nan.sum()),
                  zero_groups=int((~nonfinite & (amax == 0)).sum()), scale_underflow=int(s_under.sum()),
                  scale_overflow=int(s_over.sum()))
    return {"values": y if values else None, "codes": c.to(torch.uint8) if codes else None,
            "scales": torch.where(g.code >= 1 << 31, g.code - (1 << 32), g.code).to(torch.int32),
            "tensor_scale": ts, "amax": current, "counts": counts}


def _check_scale_codes(sc: torch.Tensor, kind: str) -> None:
    """core check_scale_codes: every scale code is one of the scale format's (its NaN code is)."""
    if kind == "fp32":
        return
    bad = (sc > _scale_max_code(kind)) & (sc != _scale_nan_code(kind))
    if bool(bad.any()):
        i = int(torch.nonzero(bad.reshape(-1))[0])
        raise _core.Error(f"decode: scales: value {int(sc.reshape(-1)[i])} at index {i} is not a {kind} code")


def _check_tensor_scale(ts: float, format) -> None:
    """core check_tensor_scale: positive and finite in float32 for two-level formats, else 1."""
    t = np.float32(ts) if np.isfinite(ts) and abs(ts) < 3.5e38 else np.float32(np.inf)
    if format.tensor_scale and not (t > 0 and np.isfinite(t)):
        raise _core.Error(f"decode: the tensor scale must be a positive finite float32 number, got {ts!r}")
    if not format.tensor_scale and t != 1:
        raise _core.Error(f"decode: {format} has no tensor scale, but one of {ts!r} was given (codes of another "
                          "format?)")


def scaled_decode_matrix(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: float,
                         format: "_core.ScaledFormat") -> torch.Tensor:
    """scaled_decode_reference: the values of a uint8 code matrix and its int32 scale codes."""
    _require_device(codes.device)
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise TypeError("decode: codes of a scaled format are a uint8 matrix")
    if scales.dtype != torch.int32:
        raise TypeError("decode: scales are int32 (the uint32 scale codes)")
    s = Scaled.of(format)
    el = s.element
    c = check_codes(codes, el, format.element, "decode")
    if not format.scaled:
        return decode(c, el)
    rows, cols = codes.shape
    br, bc = _layout(s, rows, cols)
    gr, gc = -(-rows // br) if rows else 0, -(-cols // bc) if cols else 0
    if scales.numel() != gr * gc:
        raise _core.Error(f"decode: {scales.numel()} scales given, {format} has {gr * gc} for a {rows}x{cols} matrix")
    sc = (scales.to(torch.int64) & _M32).reshape(gr, gc)
    _check_scale_codes(sc, s.scale)
    _check_tensor_scale(tensor_scale, format)
    if s.scale == "fp32":
        nan = torch.isnan(_from_bits(sc))
    else:
        sf = _SCALE_FORMATS[s.scale]
        nan = (sc > sf.max_code) | torch.isnan(decode(sc.clamp(max=sf.mag_mask), sf))
    safe = torch.where(nan, 0, sc)
    value = (_scale_value(s.scale, safe) * float(np.float32(tensor_scale))).to(torch.float32)
    e_nan, e_value = _spread(nan, br, bc, rows, cols), _spread(value, br, bc, rows, cols)
    if s.pow2:
        y = decode(c, el, el.bias - _spread(safe - 127, br, bc, rows, cols))
    elif s.dither_scale:
        y = _dither_value(decode(c, el), _spread(safe - 127, br, bc, rows, cols))
    elif s.eden:
        unit = _spread(_scale_value(s.scale, safe).to(torch.float32), br, bc, rows, cols)
        y = (decode(c, el) * unit) * torch.tensor(np.float32(tensor_scale), dtype=torch.float32, device=c.device)
    else:
        y = decode(c, el) * e_value
    return torch.where(e_nan, torch.nan, y)
