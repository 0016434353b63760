"""Per-threshold stage capacities of the throughput model (paper section 3.4), vectorised.

For a length distribution L and thresholds t (an array), `stage_curves` gives
p(t) = P(L > t), l_long = E[L | L > t], l_short = E[L | L <= t] and the per-instance prefill
rates of the long and short sides. Two modes:
- `paper`: representative length, rate = 1 / T(E[L | side]) (what the paper does);
- `exact`: expected service time, rate = 1 / E[T(L) | side] (what a queue actually sees; T is
  convex, so `paper` overstates capacity: derived, not in the paper).
Link capacity in requests/s is B / S(E[L | L > t]) in both modes (= B / E[S(L) | L > t] when S
is linear in l, i.e. for every model without sliding-window layers).
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
    """Arrays indexed like `thresholds`. A side with no mass (p_long or p_short == 0, see
    `workload.lengths.PROB_TOL`) has no requests: its conditional figures hold 0.0, are
    excluded by `bounds` and must not be read without testing its probability."""

    thresholds: FloatArray
    p_long: FloatArray  # P(L > t), summed over L > t
    p_short: FloatArray  # P(L <= t), summed over L <= t (not 1 - p_long)
    l_long: FloatArray  # E[L | L > t]
    l_short: FloatArray  # E[L | L <= t]
    long_service_s: FloatArray  # per-request prefill time on the long side (mode-dependent)
    short_service_s: FloatArray  # per-request prefill time on the short side
    long_kv_bytes: FloatArray  # mean KV bytes of a long request


def stage_curves(lengths: LengthDistribution, thresholds: FloatArray, long_prefill: PrefillTime,
                 short_prefill: PrefillTime, kv: KVSize, mode: str) -> StageCurves:
    if mode not in MODES:
        raise ConfigError("mode", mode, "must be paper or exact")
    support = lengths.support
    split = lengths.split(thresholds)
    long, short = split.p_above > 0, split.p_below > 0
    l_long, l_short = split.mean(support, above=True), split.mean(support, above=False)
    if mode == "paper":
        long_s = np.where(long, long_prefill.time_s(l_long), 0.0)
        short_s = np.where(short, short_prefill.time_s(l_short), 0.0)
    else:
        long_s = split.mean(long_prefill.time_s(support), above=True)
        short_s = split.mean(short_prefill.time_s(support), above=False)
    kv_bytes = np.where(long, kv.size_bytes(l_long), 0.0)
    return StageCurves(np.asarray(thresholds, dtype=float), split.p_above, split.p_below,
                       l_long, l_short, long_s, short_s, kv_bytes)


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
    theta_pd_p, prfaas term Theta_prfaas / p, pd-p term Theta_pd-p / (1 - p)).

    A side with no requests contributes a stage rate of 0 and a term of +inf (it never binds);
    only the other side's figures are read, so no NaN is produced. A zero service time or KV
    size gives an infinite rate for that resource, not a NaN."""
    long, short = curves.p_long > 0, curves.p_short > 0
    theta_prfaas = np.zeros_like(curves.p_long)
    theta_pdp = np.zeros_like(curves.p_long)
    with np.errstate(divide="ignore"):
        compute = np.divide(float(n_prfaas), curves.long_service_s, where=long,
                            out=np.full_like(theta_prfaas, np.inf))
        link = np.divide(float(link_bytes_per_s), curves.long_kv_bytes, where=long,
                         out=np.full_like(theta_prfaas, np.inf))
        np.minimum(compute, link, out=theta_prfaas, where=long)
        np.divide(float(n_p), curves.short_service_s, out=theta_pdp, where=short)
    prfaas_term = np.full_like(theta_prfaas, np.inf)
    pdp_term = np.full_like(theta_pdp, np.inf)
    np.divide(theta_prfaas, curves.p_long, out=prfaas_term, where=long)
    np.divide(theta_pdp, curves.p_short, out=pdp_term, where=short)
    return theta_prfaas, theta_pdp, prfaas_term, pdp_term
