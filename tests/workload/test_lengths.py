"""Exact conditional moments of the discrete length distributions."""

import numpy as np
import pytest

from prfaas.workload.lengths import empirical, truncated_lognormal


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
    assert np.isnan(d.mean_above(40))


def test_sampling_is_seeded() -> None:
    d = truncated_lognormal(9.0, 1.0, 128, 8192)
    a = d.sample(np.random.default_rng(7), 1000)
    b = d.sample(np.random.default_rng(7), 1000)
    assert (a == b).all() and a.min() >= 128 and a.max() <= 8192
