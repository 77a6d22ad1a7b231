"""The Mann-Whitney U test `fp8lab report` runs (fp8lab._core.mann_whitney_u) against
scipy.stats.mannwhitneyu: the exact distribution with ties against scipy's permutation
method enumerating every assignment, without ties against its exact method, and the normal
approximation against its asymptotic one."""
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from fp8lab import _core

ALTERNATIVES = ["less", "greater", "two-sided"]


def scipy_permutation_p(x, y, alternative):
    """scipy's p-value over all C(n1 + n2, n1) assignments of the pooled values."""
    method = stats.PermutationMethod(n_resamples=np.inf)
    return stats.mannwhitneyu(x, y, alternative=alternative, method=method).pvalue


def samples(rng, n1, n2, tied):
    """Two samples like a report's metrics over seeds: rounded to few levels when tied."""
    x, y = rng.normal(0.0, 1.0, n1), rng.normal(0.4, 1.0, n2)
    if tied:
        x, y = np.round(x * 2) / 2, np.round(y * 2) / 2
    return list(x), list(y)


@pytest.mark.parametrize("n1,n2", [(3, 3), (3, 5), (5, 5), (4, 8), (8, 8)])
@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_exact_with_ties_equals_scipy_permutation(rng, n1, n2, alternative):
    tied_cases = 0
    for _ in range(6):
        x, y = samples(rng, n1, n2, tied=True)
        tied_cases += len(set(x + y)) < n1 + n2
        r = _core.mann_whitney_u(x, y, alternative)
        assert r["exact"]
        assert r["u"] == pytest.approx(stats.mannwhitneyu(x, y, method="asymptotic").statistic, abs=0)
        assert r["p"] == pytest.approx(scipy_permutation_p(x, y, alternative), rel=1e-9, abs=1e-12)
    assert tied_cases >= 3  # the samples do have ties


@pytest.mark.parametrize("n1,n2", [(2, 2), (3, 5), (5, 5), (8, 8), (20, 20)])
@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_exact_without_ties_equals_scipy_exact(rng, n1, n2, alternative):
    for _ in range(4):
        x, y = samples(rng, n1, n2, tied=False)
        r = _core.mann_whitney_u(x, y, alternative)
        assert r["exact"]
        want = stats.mannwhitneyu(x, y, alternative=alternative, method="exact").pvalue
        assert r["p"] == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_asymptotic_equals_scipy_asymptotic(rng, tied, alternative):
    for n1, n2 in [(5, 5), (12, 30), (60, 70)]:
        x, y = samples(rng, n1, n2, tied)
        r = _core.mann_whitney_u(x, y, alternative, "asymptotic")
        assert not r["exact"]
        want = stats.mannwhitneyu(x, y, alternative=alternative, method="asymptotic", use_continuity=True)
        assert r["p"] == pytest.approx(want.pvalue, rel=1e-9, abs=1e-14)


def test_exact_by_enumeration_on_heavy_ties():
    """Every assignment counted by hand: three levels only, 4 against 5 values."""
    x, y = [1.0, 1.0, 2.0, 3.0], [2.0, 2.0, 3.0, 3.0, 3.0]
    pooled = x + y
    ranks = stats.rankdata(pooled)
    observed = ranks[: len(x)].sum()
    sums = [ranks[list(c)].sum() for c in itertools.combinations(range(len(pooled)), len(x))]
    assert len(sums) == math.comb(9, 4)
    want = sum(s <= observed + 1e-9 for s in sums) / len(sums)
    assert _core.mann_whitney_u(x, y, "less")["p"] == pytest.approx(want, rel=1e-12)


def test_bad_alternative_is_a_value_error():
    with pytest.raises(ValueError, match="alternative 'lower'"):
        _core.mann_whitney_u([1.0], [2.0], "lower")
