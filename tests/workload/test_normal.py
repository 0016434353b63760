"""The numpy normal CDF returns scipy's doubles bit for bit (lengths stay bit-identical)."""

import numpy as np
import pytest
from scipy.special import ndtr as scipy_ndtr

from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.normal import ndtr


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a.view(np.int64), b.view(np.int64)))


@pytest.mark.parametrize("mu,sigma,lo,hi", [(9.90, 1.00, 128, 131072), (7.80, 1.56, 10, 131072)])
def test_scenario_supports_are_bit_identical(mu: float, sigma: float, lo: int, hi: int) -> None:
    lengths = np.arange(lo, hi + 1, dtype=float)
    edges = np.concatenate([[lo], lengths[:-1] + 0.5, [hi]])
    z = (np.log(edges) - mu) / sigma
    assert _same_bits(ndtr(z), scipy_ndtr(z))


def test_wide_range_and_special_values_are_bit_identical() -> None:
    rng = np.random.default_rng(7)
    z = np.concatenate([rng.normal(0, 3, 200_000), rng.uniform(-45, 45, 100_000),
                        [0.0, -0.0, 1.4142135623730951, -1.4142135623730951, 11.313708498984761,
                         -38.0, -38.5, 40.0, 1e300, -1e300, np.inf, -np.inf]])
    assert _same_bits(ndtr(z), scipy_ndtr(z))
    assert np.isnan(ndtr(np.array([np.nan]))).all()


def test_lognormal_lengths_match_the_scipy_stats_definition() -> None:
    from scipy.stats import norm

    d = truncated_lognormal(9.9, 1.0, 128, 4096)
    lengths = np.arange(128, 4097, dtype=float)
    edges = np.clip(np.concatenate([[128], lengths[:-1] + 0.5, [4096]]), 128, 4096)
    pmf = np.diff(norm.cdf((np.log(edges) - 9.9) / 1.0))
    assert _same_bits(d.pmf, pmf / float(pmf.sum()))
