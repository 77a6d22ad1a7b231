"""quantize, encode and decode of NumPy arrays and torch tensors on the C++ kernels.

A NumPy array crosses to C++ as a torch tensor sharing its memory (torch.from_numpy), and
results come back as the type that went in. The kernels run with the GIL released.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Union

import numpy as np
import torch

from . import _core

FormatLike = Union[str, "_core.Format", "_core.ScaledFormat"]


def _tensor(x, what: str, *, writable: bool = False):
    """(a CPU tensor over x's memory, whether x was a NumPy array)."""
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array
        x = np.asarray(x)
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{what}: fp8lab works on CPU tensors, got one on {x.device}; use .cpu()")
        if writable and torch._debug_has_internal_overlap(x) == 1:
            raise ValueError(f"{what}: in-place quantization of a tensor whose elements share memory (an expanded "
                             "view); quantize x.clone() instead")
        return x, False
    if isinstance(x, np.ndarray):
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: the array is read-only, so it cannot be quantized in place")
        if any(s < 0 for s in x.strides):
            if writable:
                raise ValueError(f"{what}: in-place quantization of an array with negative strides; "
                                 "pass np.ascontiguousarray(x)")
            x = np.ascontiguousarray(x)
        with warnings.catch_warnings():  # a read-only array is only read here
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(x), True
    raise TypeError(f"{what}: expected a NumPy array or a torch tensor, got {type(x).__name__}")


def _is_integer(v) -> bool:
    """A Python or NumPy integer, not a bool."""
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def _check_rounding(what: str, rounding, overflow, seed, random_bits) -> None:
    """The rounding arguments' types and the seed's range, named (the kernels take them as C++ values)."""
    for name, v in (("rounding", rounding), ("overflow", overflow)):
        if not isinstance(v, str):
            raise TypeError(f"{what}: {name} must be a name (a str), not {type(v).__name__}")
    for name, v in (("seed", seed), ("random_bits", random_bits)):
        if not _is_integer(v):
            raise TypeError(f"{what}: {name} must be an integer, not {type(v).__name__}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"{what}: seed must be in 0..2^64-1 (got {seed})")


def _require_float32(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{what}: expected float32 values, got {str(t.dtype).replace('torch.', '')}; convert with "
                        ".astype(np.float32) or .float()")


def _spec(format: FormatLike):
    """A Format (fixed bias) or a ScaledFormat with a scale."""
    if isinstance(format, _core.Format):
        return format
    s = format if isinstance(format, _core.ScaledFormat) else _core.ScaledFormat(str(format))
    return s if s.scaled else s.element


def _axis(t: torch.Tensor, axis: int) -> int:
    if not _is_integer(axis):
        raise TypeError(f"axis must be an integer, not {type(axis).__name__}")
    axis = int(axis)
    if t.dim() == 0:
        raise ValueError("scaled formats need at least one dimension to group along")
    if not -t.dim() <= axis < t.dim():
        raise ValueError(f"axis {axis} does not exist in a tensor of {t.dim()} dimensions")
    return axis % t.dim()


def _matrix(t: torch.Tensor, axis: int) -> torch.Tensor:
    """The tensor as [rows, len(axis)]: the groups of a scaled format run along `axis`."""
    rows = 1
    for i, n in enumerate(t.shape):
        if i != axis:
            rows *= n
    return torch.movedim(t, axis, -1).reshape(rows, t.shape[axis]).contiguous()


def _unmatrix(m: torch.Tensor, shape, axis: int) -> torch.Tensor:
    moved = list(shape)
    moved.append(moved.pop(axis))
    return torch.movedim(m.reshape(moved), -1, axis)


def _out(t: torch.Tensor, numpy: bool):
    return t.numpy() if numpy else t


def quantize(x, format: FormatLike, *, rounding: str = "nearest-even", overflow: str = "saturate",
             seed: int = 0, random_bits: int = 32, axis: int = -1, inplace: bool = False,
             return_counts: bool = False):
    """Fake-quantizes x (float32, any shape): every value rounded to the format, as float32.

    format: a Format, a ScaledFormat or their text ("1.4.3:10", "e5m2", "mxfp4", "nvfp4").
    rounding: nearest-even, toward-zero or stochastic (element i of the row-major flattened
    tensor draws stream index i of `seed`, so the result does not depend on the layout).
    overflow: saturate, nan or inf (ieee formats). axis: scaled formats group along it.
    inplace: overwrite x. return_counts: also return what rounding did (a dict).
    Bit-identical to the C++ kernels and `fp8lab quantize`.
    """
    _check_rounding("quantize", rounding, overflow, seed, random_bits)
    t, numpy = _tensor(x, "quantize", writable=inplace)
    _require_float32(t, "quantize")
    spec = _spec(format)
    if isinstance(spec, _core.Format):
        y, counts = _core.quantize_tensor(t, spec, rounding, overflow, random_bits, seed, inplace)
    else:
        if overflow != "saturate":
            raise ValueError(f"scaled formats saturate their elements (overflow={overflow!r} given)")
        a = _axis(t, axis)
        r = _core.scaled_quantize_matrix(_matrix(t, a), spec, rounding, random_bits, seed, True, False)
        y = _unmatrix(r["values"], t.shape, a)
        if inplace:
            t.copy_(y)
            y = t
        counts = r["counts"]
    out = x if inplace else _out(y, numpy)
    return (out, counts) if return_counts else out


@dataclasses.dataclass
class ScaledCodes:
    """A scaled format's encoding: element codes in the input's shape, the scale codes of
    the groups ([grid rows, grid cols] of the matrix whose rows run along `axis`), and the
    second-level tensor scale (1.0 without one)."""
    codes: object
    scales: object
    tensor_scale: float
    format: "_core.ScaledFormat"
    axis: int


def encode(x, format: FormatLike, *, rounding: str = "nearest-even", overflow: str = "saturate",
           seed: int = 0, random_bits: int = 32, axis: int = -1, return_counts: bool = False):
    """The codes of x in the format: uint8 up to 8 bits, uint16 (int16 for torch, which has
    no uint16) up to 16; a ScaledCodes for a scaled format."""
    _check_rounding("encode", rounding, overflow, seed, random_bits)
    t, numpy = _tensor(x, "encode")
    _require_float32(t, "encode")
    spec = _spec(format)
    if isinstance(spec, _core.Format):
        codes, counts = _core.encode_tensor(t, spec, rounding, overflow, random_bits, seed)
        if numpy:
            codes = codes.numpy()
            if codes.dtype == np.int16:
                codes = codes.view(np.uint16)
        out = codes
    else:
        if overflow != "saturate":
            raise ValueError(f"scaled formats saturate their elements (overflow={overflow!r} given)")
        a = _axis(t, axis)
        m = _matrix(t, a)
        r = _core.scaled_quantize_matrix(m, spec, rounding, random_bits, seed, False, True)
        scales = r["scales"]
        codes = _unmatrix(r["codes"], t.shape, a)
        out = ScaledCodes(_out(codes, numpy), scales.numpy().view(np.uint32) if numpy else scales,
                          r["tensor_scale"], spec, a)
        counts = r["counts"]
    return (out, counts) if return_counts else out


def decode(codes, format: FormatLike = None):
    """float32 values of codes: encode's result (for a scaled format, its ScaledCodes)."""
    if isinstance(codes, ScaledCodes):
        c, numpy = _tensor(codes.codes, "decode")
        scales = codes.scales
        if isinstance(scales, np.ndarray):
            scales = np.ascontiguousarray(scales).view(np.int32)
        s, _ = _tensor(scales, "decode")
        a = codes.axis
        y = _core.scaled_decode_matrix(_matrix(c, a), s.reshape(-1), codes.tensor_scale, codes.format)
        return _out(_unmatrix(y, c.shape, a), numpy)
    if format is None:
        raise TypeError("decode: name the format the codes are of")
    spec = _spec(format)
    if not isinstance(spec, _core.Format):
        raise TypeError("decode: codes of a scaled format come as the ScaledCodes that encode returned")
    if isinstance(codes, np.ndarray) and codes.dtype == np.uint16:
        codes = codes.view(np.int16)
    t, numpy = _tensor(codes, "decode")
    return _out(_core.decode_tensor(t, spec), numpy)
