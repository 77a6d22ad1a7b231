"""fp8lab: low-precision number formats for deep learning.

Formats and their figures, bit-exact quantization of NumPy arrays and torch tensors, the
analysis of the paper "8-bit Numerical Formats for Deep Neural Networks", and (in
fp8lab.torch) quantized training of any PyTorch model. Everything runs on the C++ library's
kernels (the extension module fp8lab._core); see docs/python.md.
"""
from ._core import Format, ScaledFormat, Recipe  # noqa: F401
from ._arrays import quantize, encode, decode  # noqa: F401
from ._analysis import (  # noqa: F401
    formats, presets, scaled_presets, recipe_presets, dynamic_range_db, snr_model_db,
    measured_snr_db, sample, exponent_histogram,
)

__all__ = [
    "Format", "ScaledFormat", "Recipe", "quantize", "encode", "decode", "formats", "presets",
    "scaled_presets", "recipe_presets", "dynamic_range_db", "snr_model_db", "measured_snr_db",
    "sample", "exponent_histogram",
]
