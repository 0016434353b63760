"""Exact conditional moments of the discrete length distributions."""

import numpy as np
import pytest

from prfaas.workload.lengths import PROB_TOL, LengthDistribution, empirical, truncated_lognormal


def test_lognormal_mass_and_moments_match_sampling() -> None:
    d = truncated_lognormal(9.9, 1.0, 128, 131072)
    assert d.pmf.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    raw = np.exp(rng.normal(9.9, 1.0, 2_000_000))
    raw = raw[(raw >= 128) & (raw <= 131072)]
    assert d.mean() == pytest.approx(raw.mean(), rel=0.005)
    assert d.prob_above(19400) == pytest.approx((raw > 19400).mean(), abs=0.002)
    assert d.mean_above(19400) == pytest.approx(raw[raw > 19400].mean(), rel=0.005)


def test_empirical_conditional_means_are_exact() -> None:
    d = empirical([10, 20, 20, 40])
    assert d.prob_above(20) == 0.25
    assert d.mean_above(15) == pytest.approx(80 / 3)
    assert d.mean_below(20) == pytest.approx(50 / 3)
    assert d.expect(lambda x: x * x, 0, above=True) == pytest.approx((100 + 800 + 1600) / 4)
    assert d.mean_above(40) is None and d.mean_below(9) is None  # empty sides: excluded


def test_each_side_is_summed_from_its_own_terms() -> None:
    """At the top of the support P(L > t) is exactly 0 (it was 1 - cumsum = 4.4e-16), at the
    bottom P(L <= t) is; a tiny but real tail keeps its relative precision."""
    d = truncated_lognormal(8.0, 0.6, 256, 8192)
    assert 1.0 - float(np.cumsum(d.pmf)[-1]) != 0.0  # the residue the old code read as mass
    s = d.split([255, 1000, 8191, 8192])
    assert s.p_above[-1] == 0.0 and s.p_below[-1] == 1.0
    assert s.p_below[0] == 0.0 and s.p_above[0] == 1.0
    tail = float(d.pmf[-1])  # P(L > 8191) = P(L = 8192), ~1e-6 here
    assert s.p_above[2] == pytest.approx(tail, rel=1e-15)
    means = s.mean(d.support, above=True)
    assert np.isfinite(means).all() and means[-1] == 0.0 and means[2] == 8192.0
    assert d.prob_above(8192) == 0.0 and d.mean_above(8192) is None


def test_masses_below_the_tolerance_are_zero_and_above_it_are_kept() -> None:
    lo_mass = PROB_TOL / 10
    d = LengthDistribution(100, np.array([1.0 - lo_mass, lo_mass]))
    s = d.split([100])
    assert s.p_above[0] == 0.0 and s.p_below[0] == 1.0 and d.mean_above(100) is None
    # negative control: a mass 10x above the tolerance is a real side
    d = LengthDistribution(100, np.array([1.0 - 10 * PROB_TOL, 10 * PROB_TOL]))
    assert d.prob_above(100) == pytest.approx(10 * PROB_TOL, rel=1e-3)
    assert d.mean_above(100) == pytest.approx(101.0, rel=1e-15)


def test_upper_tail_pmf_keeps_relative_precision() -> None:
    """Far above the median the pmf comes from Q = Phi(-z), not 1 - Phi: every length keeps a
    positive mass equal to the density's integral (checked against the analytic ratio of two
    neighbouring masses, exp of the log-density difference, to 1e-6)."""
    d = truncated_lognormal(5.0, 0.5, 100, 2000)  # z(2000) = 5.2: Phi(z) = 1 - 1e-7
    assert (d.pmf > 0).all()
    lengths = d.support[-3:]
    log_pdf = -np.log(lengths) - (np.log(lengths) - 5.0) ** 2 / (2 * 0.5**2)
    assert d.pmf[-2] / d.pmf[-3] == pytest.approx(np.exp(log_pdf[1] - log_pdf[0]), rel=1e-6)


def test_sampling_is_seeded() -> None:
    d = truncated_lognormal(9.0, 1.0, 128, 8192)
    a = d.sample(np.random.default_rng(7), 1000)
    b = d.sample(np.random.default_rng(7), 1000)
    assert (a == b).all() and a.min() >= 128 and a.max() <= 8192
