"""The numpy normal CDF against scipy's within a derived bound, and against itself bit for bit.

Bound (ours vs scipy.special.ndtr): |ours - scipy| <= 8 eps |scipy| + 16 * 2^-1074, eps = 2^-52.
Both run Cephes' ndtr: the same branches, coefficients and operation order, so every +, *, /
is the same correctly rounded IEEE operation on the same operands. The one operation that is
not is exp(-x^2) in the erfc branch: numpy dispatches it at run time (AVX-512F here: Intel
SVML's "LA" exp, <= 4 ulp; AVX2 or the scalar loop elsewhere), scipy calls the C library's exp
(<= 1 ulp). So exp differs by <= 5 ulp (<= 5 eps relative); the product and quotient after it
add <= 1/2 ulp each on each side (2 eps); 0.5 * is exact, and 1 - h for x > 0 only shrinks a
relative error (h <= 0.16 < 1 - h). Total <= 7 eps, rounded up to 8 eps. Where exp's result is
subnormal (x^2 in [708.4, 709.8]) relative error is unbounded but absolute error is a few
2^-1074, hence the absolute floor. Measured on this CPU (AVX-512): 2.1 eps, 3 ulps.
A real defect (a coefficient off at 1e-12, a 1e-9 shift) exceeds the bound by >= 100x: see the
negative controls.
"""

import numpy as np
import pytest
from scipy.special import ndtr as scipy_ndtr

from prfaas.workload import normal
from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.normal import ndtr

EPS = 2.0**-52
REL_BOUND = 8 * EPS
ABS_FLOOR = 16 * 2.0**-1074


def _excess(ours: np.ndarray, ref: np.ndarray, bound: np.ndarray | float) -> float:
    """max |ours - ref| / allowed; <= 1 passes. nan must match nan."""
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    ok = ~np.isnan(ref)
    same = ours[ok] == ref[ok]  # also +-inf and exact zeros
    allowed = np.broadcast_to(bound, ref.shape)[ok] * np.abs(ref[ok]) + ABS_FLOOR
    diff = np.where(same, 0.0, np.abs(ours[ok] - ref[ok]))
    return float(np.max(diff / allowed))


def _wide_z() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate([rng.normal(0, 3, 200_000), rng.uniform(-45, 45, 100_000),
                           [0.0, -0.0, 1.4142135623730951, -1.4142135623730951,
                            11.313708498984761, -37.5, -37.6, -38.0, -38.5, 40.0, 1e300,
                            -1e300, np.inf, -np.inf, np.nan]])


@pytest.mark.parametrize("mu,sigma,lo,hi", [(9.90, 1.00, 128, 131072), (7.80, 1.56, 10, 131072)])
def test_scenario_supports_are_within_the_bound(mu: float, sigma: float, lo: int, hi: int
                                                ) -> None:
    lengths = np.arange(lo, hi + 1, dtype=float)
    edges = np.concatenate([[lo], lengths[:-1] + 0.5, [hi]])
    z = (np.log(edges) - mu) / sigma
    assert _excess(ndtr(z), scipy_ndtr(z), REL_BOUND) <= 1.0
    assert _excess(ndtr(-z), scipy_ndtr(-z), REL_BOUND) <= 1.0  # the upper-tail masses


def test_wide_range_and_special_values_are_within_the_bound() -> None:
    z = _wide_z()
    assert _excess(ndtr(z), scipy_ndtr(z), REL_BOUND) <= 1.0
    exact = ndtr(np.array([0.0, -0.0, np.inf, -np.inf, 1e300, -1e300, np.nan]))
    assert exact[:6].tolist() == [0.5, 0.5, 1.0, 0.0, 1.0, 0.0] and np.isnan(exact[6])


def test_same_inputs_give_the_same_bits() -> None:
    """The project against itself: no bound, bit for bit (determinism)."""
    z = _wide_z()
    assert np.array_equal(ndtr(z).view(np.int64), ndtr(z.copy()).view(np.int64))
    a, b = truncated_lognormal(9.9, 1.0, 128, 131072), truncated_lognormal(9.9, 1.0, 128, 131072)
    assert np.array_equal(a.pmf.view(np.int64), b.pmf.view(np.int64))


@pytest.mark.parametrize("table,index,rel", [("_P", 1, 1e-12), ("_T", 4, 1e-12),
                                              ("_R", 0, 1e-12), ("_Q", 2, 1e-12)])
def test_negative_control_a_coefficient_off_at_1e12_fails_the_bound(
        monkeypatch: pytest.MonkeyPatch, table: str, index: int, rel: float) -> None:
    coef = list(getattr(normal, table))
    coef[index] *= 1 + rel
    monkeypatch.setattr(normal, table, tuple(coef))
    z = _wide_z()
    assert _excess(normal.ndtr(z), scipy_ndtr(z), REL_BOUND) > 10


def test_negative_control_a_1e9_relative_shift_fails_the_bound() -> None:
    z = _wide_z()
    assert _excess(ndtr(z) * (1 + 1e-9), scipy_ndtr(z), REL_BOUND) > 100


def _pmf_bound(cdf: np.ndarray) -> np.ndarray:
    """Relative bound on each pmf entry p_i = (F(b) - F(a)) / S from CDF values that each
    carry <= 8 eps relative error: the difference carries 8 eps (F(a) + F(b)) absolute (the
    subtraction itself is exact or 1/2 ulp), S = sum p over n entries carries that summed
    (telescoping: <= 16 eps F(hi)) plus the summation's own n eps, the division 1/2 ulp."""
    diff = np.diff(cdf)
    total = diff.sum()
    return (REL_BOUND * (cdf[:-1] + cdf[1:]) / diff + 2 * REL_BOUND * cdf[-1] / total
            + diff.size * EPS + 2 * EPS)


def test_lognormal_lengths_match_the_scipy_stats_definition() -> None:
    """The pmf is the scipy.stats log-normal's mass per token, normalised (all of this support
    is below the median, where both take CDF differences)."""
    from scipy.stats import norm

    d = truncated_lognormal(9.9, 1.0, 128, 4096)
    lengths = np.arange(128, 4097, dtype=float)
    edges = np.clip(np.concatenate([[128], lengths[:-1] + 0.5, [4096]]), 128, 4096)
    cdf = norm.cdf((np.log(edges) - 9.9) / 1.0)
    ref = np.diff(cdf) / float(np.diff(cdf).sum())
    bound = _pmf_bound(cdf)
    assert _excess(d.pmf, ref, bound) <= 1.0
    # negative control: a 1e-9 tilt across the support (normalised away only if uniform)
    tilted = d.pmf * (1 + 1e-9 * np.linspace(-1, 1, d.pmf.size))
    assert _excess(tilted / tilted.sum(), ref, bound) > 1.0
