"""Inputs that probe a format's rounding: every boundary (values, midpoints, the float32
numbers on either side, the overflow threshold, zeros, infinities, NaNs) and sampled
inputs. Shared by the reference comparisons (test_references.py, test_portable.py)."""
import numpy as np

import fp8lab


def codes_of(fmt: fp8lab.Format) -> np.ndarray:
    return np.arange(2 ** fmt.bits, dtype=np.uint16)


def finite_values(fmt: fp8lab.Format) -> np.ndarray:
    """Every finite value of the format, from decoding each of its codes."""
    v = fp8lab.decode(codes_of(fmt).astype(np.uint8) if fmt.bits <= 8 else codes_of(fmt), fmt)
    return np.unique(v[np.isfinite(v)].astype(np.float64))


def boundary_inputs(fmt: fp8lab.Format) -> np.ndarray:
    """Each value, each midpoint between neighbouring values (a tie), the float32 numbers
    on either side of both, the overflow threshold, zeros, infinities and NaNs, both signs."""
    v = finite_values(fmt)
    mags = np.abs(v)
    mags = np.unique(np.concatenate([mags, [0.0]]))
    mids = (mags[:-1] + mags[1:]) / 2
    top = mags[-1] + (mags[-1] - mags[-2]) / 2  # where rounding past max begins
    with np.errstate(over="ignore"):  # past float32's range (bfloat16's top): Inf, an input like any other
        pts = np.concatenate([mags, mids, [top, 2 * mags[-1], mags[1] / 2, mags[1] / 4]]).astype(np.float32)
    near = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    special = np.array([np.inf, np.nan, np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal,
                        np.finfo(np.float32).tiny], np.float32)
    x = np.concatenate([near, special])
    return np.concatenate([x, -x]).astype(np.float32)


def sampled_inputs(fmt: fp8lab.Format, n: int, seed: int) -> np.ndarray:
    """n random float32 bit patterns (every class of input) and n values spread evenly in
    log scale over the format's range and a few binades either side."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    v = finite_values(fmt)
    pos = v[v > 0]
    lo, hi = np.log2(pos.min()) - 3, np.log2(pos.max()) + 2
    with np.errstate(over="ignore"):
        mags = np.exp2(rng.uniform(lo, hi, size=n)).astype(np.float32)
    signs = np.where(rng.integers(0, 2, size=n) == 1, -1, 1).astype(np.float32)
    return np.concatenate([bits, mags * signs])
