"""fp8lab: low-precision number formats for deep learning.

Formats and their figures, bit-exact quantization of NumPy arrays and torch tensors, the
analysis of the paper "8-bit Numerical Formats for Deep Neural Networks", and (in
fp8lab.torch) quantized training of any PyTorch model. Everything runs on the C++ library's
kernels (the extension module fp8lab._core); see docs/python.md.
"""
import torch as _torch

from ._build import TORCH_VERSION as _BUILT_FOR

if _torch.__version__ != _BUILT_FOR:
    raise ImportError(
        f"fp8lab was built against torch {_BUILT_FOR}, but this environment has torch "
        f"{_torch.__version__}: libtorch's C++ interface changes with every release. Rebuild fp8lab "
        "here (pip install --no-build-isolation --force-reinstall <fp8lab source>) or install "
        f"torch=={_BUILT_FOR.split('+')[0]}.")

from ._core import Format, ScaledFormat, Recipe  # noqa: F401
from ._arrays import quantize, encode, decode  # noqa: F401
from ._dtypes import from_torch, to_torch, torch_dtype  # noqa: F401
from ._data import bible_verses, plot_lines  # noqa: F401
from ._analysis import (  # noqa: F401
    formats, presets, scaled_presets, recipe_presets, dynamic_range_db, snr_model_db,
    measured_snr_db, sample, exponent_histogram,
)

__all__ = [
    "Format", "ScaledFormat", "Recipe", "quantize", "encode", "decode", "to_torch", "from_torch", "torch_dtype",
    "bible_verses", "plot_lines", "formats", "presets",
    "scaled_presets", "recipe_presets", "dynamic_range_db", "snr_model_db", "measured_snr_db",
    "sample", "exponent_histogram",
]
