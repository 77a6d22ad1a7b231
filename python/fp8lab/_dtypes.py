"""fp8lab's codes as torch's own low-precision dtypes, and back (docs/python.md, "torch's
dtypes"): float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, float8_e8m0fnu and
float4_e2m1fn_x2 hold the same bits as fp8lab's codes of e4m3fn, e5m2, e4m3fnuz, e5m2fnuz,
e8m0 and e2m1fn, so the 8-bit ones convert as views of the same memory. float4_e2m1fn_x2
packs two codes per byte, element 2i in the low four bits and 2i+1 in the high four
(c10's Float4_e2m1fn_x2, torchao's pack_uint4): those convert with one copy.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np
import torch

from . import _core

# torch's dtype, the fp8lab format whose codes are its bits, codes per byte.
_PAIRS = (
    ("float8_e4m3fn", "e4m3fn", 1),
    ("float8_e5m2", "e5m2", 1),
    ("float8_e4m3fnuz", "e4m3fnuz", 1),
    ("float8_e5m2fnuz", "e5m2fnuz", 1),
    ("float8_e8m0fnu", "e8m0", 1),
    ("float4_e2m1fn_x2", "e2m1fn", 2),
)
# The scales of scaled formats as torch dtypes: UE4M3's codes (0..127) are the non-negative
# codes of E4M3FN, as torchao's NVFP4 stores them; float32 scales are float32.
_SCALE_DTYPES = {"e8m0": "float8_e8m0fnu", "ue4m3": "float8_e4m3fn", "fp32": "float32"}


@functools.lru_cache(maxsize=None)
def _table():
    """(dtype, Format, codes per byte) of the dtypes this torch has (made once: decode asks)."""
    return tuple((getattr(torch, d), _core.Format(f), k) for d, f, k in _PAIRS if hasattr(torch, d))


def torch_dtype(format) -> Optional[torch.dtype]:
    """The torch dtype whose bits are the codes of `format` (a Format or its text), or None."""
    f = format if isinstance(format, _core.Format) else _core.Format(str(format))
    return next((d for d, g, _ in _table() if g == f), None)


def format_of(dtype: torch.dtype) -> Optional["_core.Format"]:
    """The fp8lab format whose codes are the bits of a torch dtype, or None."""
    return next((g for d, g, _ in _table() if d == dtype), None)


def _names() -> str:
    return ", ".join(f"{str(d).replace('torch.', '')} ({g})" for d, g, _ in _table())


def to_torch(codes, format) -> torch.Tensor:
    """The codes of `format` (uint8, from fp8lab.encode) as a tensor of the torch dtype with
    the same bits: a view of the same memory, or for float4_e2m1fn_x2 the codes packed in
    pairs along the last axis (which must have an even length)."""
    f = format if isinstance(format, _core.Format) else _core.Format(str(format))
    dtype = torch_dtype(f)
    if dtype is None:
        raise ValueError(f"to_torch: {f} has no torch dtype; the formats with one are {_names()}")
    t = torch.from_numpy(codes) if isinstance(codes, np.ndarray) else codes
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise TypeError(f"to_torch: expected the uint8 codes of {f}, got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if dtype.itemsize == 1 and not str(dtype).endswith("_x2"):
        return t.view(dtype)
    if t.dim() == 0 or t.shape[-1] % 2 != 0:
        raise ValueError(f"to_torch: {str(dtype).replace('torch.', '')} packs two codes per byte along the last "
                         f"axis, which has {t.shape[-1] if t.dim() else 'no'} elements here (an even count is needed)")
    if bool((t >> 4).any()):
        raise ValueError(f"to_torch: a value above 15 is no 4-bit code of {f}")
    return (t[..., 0::2] | (t[..., 1::2] << 4)).view(dtype)


def from_torch(t: torch.Tensor) -> Tuple[torch.Tensor, "_core.Format"]:
    """A tensor of one of torch's float8/float4 dtypes as (uint8 codes, their fp8lab Format):
    a view of the same memory, or for float4_e2m1fn_x2 the codes unpacked (the last axis
    doubles)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_torch: expected a torch tensor, got {type(t).__name__}")
    f = format_of(t.dtype)
    if f is None:
        raise TypeError(f"from_torch: {str(t.dtype).replace('torch.', '')} holds no fp8lab codes; the dtypes that do "
                        f"are {_names()}")
    raw = t.view(torch.uint8)
    if not str(t.dtype).endswith("_x2"):
        return raw, f
    if raw.dim() == 0:  # one byte, two codes: a row of two
        raw = raw.reshape(1)
    return torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2), f


def scales_to_torch(scales: torch.Tensor, scale_format: str) -> torch.Tensor:
    """A scaled format's scale codes (int32, from ScaledCodes) as torch's dtype for them:
    float8_e8m0fnu (E8M0), float8_e4m3fn (UE4M3) or float32 (its bits)."""
    name = _SCALE_DTYPES.get(scale_format)
    if name is None:
        raise ValueError(f"to_torch: a fixed-bias format has no scales (scale format {scale_format!r})")
    if name == "float32":
        return scales.view(torch.float32)
    return scales.to(torch.uint8).view(getattr(torch, name))
