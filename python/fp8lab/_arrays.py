"""quantize, encode and decode of NumPy arrays and torch tensors on the C++ kernels.

A NumPy array crosses to C++ as a torch tensor sharing its memory (torch.from_numpy), and
results come back as the type that went in. The kernels run with the GIL released.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Tuple, Union

import numpy as np
import torch

from . import _core, _dtypes, _portable

FormatLike = Union[str, "_core.Format", "_core.ScaledFormat"]


_BACKENDS = ("auto", "kernels", "torch")


def _ops(x, backend: str, what: str):
    """The quantizers x goes through: the C++ kernels (fp8lab._core), or the same quantizers
    written as torch operations (fp8lab._portable) for backend "torch", or "auto" and a tensor
    that is not on the CPU. Both offer quantize_tensor, encode_tensor, decode_tensor,
    scaled_quantize_matrix and scaled_decode_matrix with one signature."""
    if backend not in _BACKENDS:
        raise ValueError(f"{what}: backend={backend!r}: expected one of {', '.join(_BACKENDS)}")
    off_cpu = isinstance(x, torch.Tensor) and x.device.type != "cpu"
    if backend == "kernels" and off_cpu:
        raise TypeError(f"{what}: the C++ kernels work on CPU tensors, got one on {x.device}; use .cpu() or "
                        "backend='torch' (or 'auto')")
    return _portable if backend == "torch" or (backend == "auto" and off_cpu) else _core


def _tensor(x, what: str, *, writable: bool = False):
    """(a tensor over x's memory, whether x was a NumPy array)."""
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array
        x = np.asarray(x)
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(f"{what}: expected a dense tensor, got one of layout {str(x.layout).replace('torch.', '')}; "
                            "convert it with .to_dense()")
        if writable and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
            raise ValueError(f"{what}: in-place quantization of a leaf tensor that requires grad (autograd forbids "
                             "it); quantize it under torch.no_grad() or quantize x.detach()")
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


def _fixed_bias_axis(t: torch.Tensor, axis) -> None:
    """A fixed-bias format has no groups, so `axis` changes nothing, but a wrong one is still
    an error (not silently ignored): an integer naming an axis of t (any, for a 0-d t)."""
    if t.dim() > 0:
        _axis(t, axis)
    elif not _is_integer(axis):
        raise TypeError(f"axis must be an integer, not {type(axis).__name__}")


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
             return_counts: bool = False, backend: str = "auto"):
    """Fake-quantizes x (float32, any shape): every value rounded to the format, as float32.

    format: a Format, a ScaledFormat or their text ("1.4.3:10", "e5m2", "mxfp4", "nvfp4").
    rounding: nearest-even, toward-zero, nearest-away (ties away from zero) or stochastic (element i of the row-major flattened
    tensor draws stream index i of `seed`, so the result does not depend on the layout).
    overflow: saturate, nan or inf (ieee formats). axis: scaled formats group along it.
    inplace: overwrite x. return_counts: also return what rounding did (a dict).
    backend: "kernels" (the C++ library, CPU), "torch" (torch operations on x's device) or
    "auto" (the kernels on the CPU, torch elsewhere). Bit-identical to `fp8lab quantize`.
    """
    ops = _ops(x, backend, "quantize")
    _check_rounding("quantize", rounding, overflow, seed, random_bits)
    t, numpy = _tensor(x, "quantize", writable=inplace)
    _require_float32(t, "quantize")
    spec = _spec(format)
    if isinstance(spec, _core.Format):
        _fixed_bias_axis(t, axis)
        y, counts = ops.quantize_tensor(t, spec, rounding, overflow, random_bits, seed, inplace)
    else:
        if overflow != "saturate":
            raise ValueError(f"scaled formats saturate their elements (overflow={overflow!r} given)")
        a = _axis(t, axis)
        r = ops.scaled_quantize_matrix(_matrix(t, a), spec, rounding, random_bits, seed, True, False)
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

    def _checked(self, what: str) -> Tuple["_core.ScaledFormat", int]:
        """(the scaled format, the 0-based axis) of these codes, checked: a ScaledFormat (or
        its name) and an axis of the codes (a dataclass's fields can be set to anything)."""
        f = self.format
        if isinstance(f, str):
            f = _core.ScaledFormat(f)
        if not isinstance(f, _core.ScaledFormat) or not f.scaled:
            raise TypeError(f"{what}: ScaledCodes.format must be a scaled format (a ScaledFormat or its name, "
                            f"e.g. 'mxfp4'), got {f!r}")
        codes, _ = _tensor(self.codes, what)
        return f, _axis(codes, self.axis)

    def to_torch(self):
        """(element codes, scales) as torch's dtypes: the elements as fp8lab.to_torch gives
        them (float8 views; float4_e2m1fn_x2 packed along the last axis), the scales as
        float8_e8m0fnu (E8M0), float8_e4m3fn (UE4M3, non-negative codes) or float32. The
        tensor scale is self.tensor_scale."""
        f, _ = self._checked("to_torch")
        codes, _ = _tensor(self.codes, "to_torch")
        return (_dtypes.to_torch(codes, f.element),
                _dtypes.scales_to_torch(self._scale_tensor("to_torch"), f.scale_format))

    def _scale_tensor(self, what: str) -> torch.Tensor:
        """The scale codes as the int32 tensor the kernels take (uint32 NumPy codes viewed so)."""
        scales = self.scales
        if isinstance(scales, np.ndarray):
            scales = np.ascontiguousarray(scales).view(np.int32)
        return _tensor(scales, what)[0]


def encode(x, format: FormatLike, *, rounding: str = "nearest-even", overflow: str = "saturate",
           seed: int = 0, random_bits: int = 32, axis: int = -1, return_counts: bool = False,
           backend: str = "auto"):
    """The codes of x in the format: uint8 up to 8 bits, uint16 (int16 for torch, which has
    no uint16) up to 16; a ScaledCodes for a scaled format. backend: as quantize's."""
    ops = _ops(x, backend, "encode")
    _check_rounding("encode", rounding, overflow, seed, random_bits)
    t, numpy = _tensor(x, "encode")
    _require_float32(t, "encode")
    spec = _spec(format)
    if isinstance(spec, _core.Format):
        _fixed_bias_axis(t, axis)
        codes, counts = ops.encode_tensor(t, spec, rounding, overflow, random_bits, seed)
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
        r = ops.scaled_quantize_matrix(m, spec, rounding, random_bits, seed, False, True)
        scales = r["scales"]
        codes = _unmatrix(r["codes"], t.shape, a)
        out = ScaledCodes(_out(codes, numpy), scales.numpy().view(np.uint32) if numpy else scales,
                          r["tensor_scale"], spec, a)
        counts = r["counts"]
    return (out, counts) if return_counts else out


def decode(codes, format: FormatLike = None, *, backend: str = "auto"):
    """float32 values of codes: encode's result (for a scaled format, its ScaledCodes).
    backend: as quantize's."""
    ops = _ops(codes.codes if isinstance(codes, ScaledCodes) else codes, backend, "decode")
    if isinstance(codes, ScaledCodes):
        f, a = codes._checked("decode")
        c, numpy = _tensor(codes.codes, "decode")
        s = codes._scale_tensor("decode")
        ts = codes.tensor_scale
        if isinstance(ts, bool) or not isinstance(ts, (int, float, np.floating, np.integer)):
            raise TypeError(f"decode: ScaledCodes.tensor_scale must be a number, got {type(ts).__name__}")
        y = ops.scaled_decode_matrix(_matrix(c, a), s.reshape(-1), float(ts), f)
        return _out(_unmatrix(y, c.shape, a), numpy)
    if isinstance(codes, torch.Tensor) and _dtypes.format_of(codes.dtype) is not None:
        codes, own = _dtypes.from_torch(codes)  # torch's float8/float4 dtypes carry their format
        if format is not None and _spec(format) != own:
            raise ValueError(f"decode: the codes are {own} (their dtype says so), not {_spec(format)}")
        format = own
    if format is None:
        raise TypeError("decode: name the format the codes are of")
    spec = _spec(format)
    if not isinstance(spec, _core.Format):
        raise TypeError("decode: codes of a scaled format come as the ScaledCodes that encode returned")
    if isinstance(codes, np.ndarray) and codes.dtype == np.uint16:
        codes = codes.view(np.int16)
    t, numpy = _tensor(codes, "decode")
    return _out(ops.decode_tensor(t, spec), numpy)
