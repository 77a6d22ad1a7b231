"""Format tables and the analysis of the paper (docs/spec.md §3), on the C++ library."""
from __future__ import annotations

from typing import List

import numpy as np

from . import _core
from ._arrays import _axis, _matrix, _require_float32, _spec, _tensor


def formats(*names: str) -> List[dict]:
    """Table 1 as rows (dicts with the columns of `fp8lab formats`): the paper's formats by
    default, or the named ones ("1.4.3:10", "e4m3fn", ...)."""
    return [_core.format_row(n) for n in (names or _core.table1_names())]


def presets() -> List[dict]:
    """Every named format: {'name', 'format', 'note'}."""
    return _core.presets()


def scaled_presets() -> List[dict]:
    """Every named scaled format (mxfp8_e4m3, nvfp4, deepseek_1x128, ...)."""
    return _core.scaled_presets()


def recipe_presets() -> List[dict]:
    """Every named recipe: {'name', 'recipe', 'note'}."""
    return _core.recipe_presets()


def dynamic_range_db(format) -> float:
    """20 log10(largest finite / smallest positive value)."""
    return _core.dynamic_range_db(_core.Format(str(format)) if isinstance(format, str) else format)


def snr_model_db(format, dist: str = "normal", scale: float = 1.0) -> float:
    """The SNR model: the paper's Appendix A for a scaled integer (E = 0) on `dist`
    (normal, uniform, laplace; NaN where no closed form exists), Appendix B otherwise."""
    return _core.snr_model_db(_core.Format(str(format)) if isinstance(format, str) else format, dist, scale)


def sample(dist: str, n: int, *, seed: int = 0, scale: float = 1.0, numpy: bool = True):
    """n deterministic samples (the same on every machine for a seed) of normal, uniform,
    laplace, loguniform, student-t:DOF or normal-outliers:FRACTION:SCALE, times `scale`."""
    t = _core.sample(dist, n, seed, scale)
    return t.numpy() if numpy else t


def measured_snr_db(x, format, *, axis: int = -1) -> float:
    """10 log10(sum x^2 / sum (x - Q(x))^2) under nearest-even, saturating rounding; for a
    scaled format with its groups along `axis`."""
    t, _ = _tensor(x, "measured_snr_db")
    _require_float32(t, "measured_snr_db")
    spec = _spec(format)
    if isinstance(spec, _core.Format):
        return _core.measured_snr_db(t, spec)
    a = _axis(t, axis)
    return _core.measured_scaled_snr_db(_matrix(t, a), spec, t.shape[a])


def exponent_histogram(x) -> dict:
    """Counts of floor(log2 |x|): {'lo': e, 'counts': [n(e), n(e+1), ...], 'zero', 'inf',
    'nan'}, from the lowest to the highest exponent present."""
    t, _ = _tensor(x, "exponent_histogram")
    _require_float32(t, "exponent_histogram")
    h = _core.exponent_histogram(t)
    h["counts"] = np.asarray(h["counts"], dtype=np.int64)
    return h
