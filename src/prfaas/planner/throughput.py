"""Per-threshold stage capacities of the throughput model (paper section 3.4), vectorised.

For a length distribution L and thresholds t (an array), `stage_curves` gives
p(t) = P(L > t), l_long = E[L | L > t], l_short = E[L | L <= t] and the per-instance prefill
rates of the long and short sides. Two modes:
- `paper`: representative length, rate = 1 / T(E[L | side]) (what the paper does);
- `exact`: expected service time, rate = 1 / E[T(L) | side] (what a queue actually sees; T is
  convex, so `paper` overstates capacity: derived, not in the paper).
Link capacity in requests/s is B / E[S(L) | L > t] in both modes (S is linear in l).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from prfaas.core.errors import ConfigError
from prfaas.models.profile import KVSize, PrefillTime
from prfaas.workload.lengths import LengthDistribution

FloatArray = NDArray[np.float64]
MODES = ("paper", "exact")


@dataclass(frozen=True)
class StageCurves:
    """Arrays indexed like `thresholds`."""

    thresholds: FloatArray
    p_long: FloatArray
    l_long: FloatArray  # nan where p_long == 0
    l_short: FloatArray  # nan where p_long == 1
    long_service_s: FloatArray  # per-request prefill time on the long side (mode-dependent)
    short_service_s: FloatArray  # per-request prefill time on the short side
    long_kv_bytes: FloatArray  # mean KV bytes of a long request


def _conditional_sums(lengths: LengthDistribution, values: FloatArray, thresholds: FloatArray
                      ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(mass <= t, sum of pmf*values over L <= t, total sum) for each t."""
    cum_mass = np.concatenate([[0.0], np.cumsum(lengths.pmf)])
    cum_val = np.concatenate([[0.0], np.cumsum(lengths.pmf * values)])
    idx = np.clip(np.floor(thresholds) - lengths.lo + 1, 0, lengths.pmf.size).astype(int)
    return cum_mass[idx], cum_val[idx], np.full_like(thresholds, cum_val[-1])


def _split_mean(below_mass: FloatArray, below_sum: FloatArray, total: FloatArray
                ) -> tuple[FloatArray, FloatArray]:
    with np.errstate(invalid="ignore", divide="ignore"):
        above = np.where(below_mass < 1.0 - 1e-15, (total - below_sum) / (1.0 - below_mass), np.nan)
        below = np.where(below_mass > 1e-15, below_sum / below_mass, np.nan)
    return above, below


def stage_curves(lengths: LengthDistribution, thresholds: FloatArray, long_prefill: PrefillTime,
                 short_prefill: PrefillTime, kv: KVSize, mode: str) -> StageCurves:
    if mode not in MODES:
        raise ConfigError("mode", mode, "must be paper or exact")
    support = lengths.support
    below_mass, below_l, total_l = _conditional_sums(lengths, support, thresholds)
    l_long, l_short = _split_mean(below_mass, below_l, total_l)
    if mode == "paper":
        long_s = long_prefill.time_s(l_long)
        short_s = short_prefill.time_s(l_short)
    else:
        _, below_tl, total_tl = _conditional_sums(lengths, long_prefill.time_s(support), thresholds)
        long_s, _ = _split_mean(below_mass, below_tl, total_tl)
        _, below_ts, total_ts = _conditional_sums(lengths, short_prefill.time_s(support),
                                                  thresholds)
        _, short_s = _split_mean(below_mass, below_ts, total_ts)
    return StageCurves(thresholds, 1.0 - below_mass, l_long, l_short, long_s, short_s,
                       kv.size_bytes(np.nan_to_num(l_long)))


def mean_service_s(lengths: LengthDistribution, prefill: PrefillTime, mode: str) -> float:
    """Per-request prefill time over the whole distribution (no threshold)."""
    if mode == "paper":
        return float(prefill.time_s(lengths.mean()))
    return float(np.dot(lengths.pmf, prefill.time_s(lengths.support)))


def decode_rate(n_d: int | FloatArray, bs_max: int, step_s: float, output_tokens: int
                ) -> FloatArray:
    """Eq. 5: N_d * BS_max / (T_decode * L_out)."""
    return np.asarray(n_d, dtype=float) * bs_max / (step_s * output_tokens)


def bounds(curves: StageCurves, n_prfaas: int, n_p: int, link_bytes_per_s: float
           ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Eqs 3, 4 and the first two terms of Eq. 6 for every threshold: (theta_prfaas,
    theta_pd_p, prfaas term Theta_prfaas / p, pd-p term Theta_pd-p / (1 - p))."""
    with np.errstate(invalid="ignore", divide="ignore"):
        compute = n_prfaas / curves.long_service_s
        link = link_bytes_per_s / curves.long_kv_bytes
        theta_prfaas = np.where(curves.p_long > 0, np.minimum(compute, link), 0.0)
        theta_pdp = np.where(curves.p_long < 1, n_p / curves.short_service_s, 0.0)
        prfaas_term = np.where(curves.p_long > 0, theta_prfaas / curves.p_long, np.inf)
        pdp_term = np.where(curves.p_long < 1, theta_pdp / (1.0 - curves.p_long), np.inf)
    return theta_prfaas, theta_pdp, prfaas_term, pdp_term
