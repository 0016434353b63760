"""Exhaustive grid search over the threshold t and the N_p:N_d split (Eqs 6-8).

`PlanInputs` holds plain numbers and profiles, so the live threshold controller can re-solve t
with measured bandwidth and a recent length distribution; `plan_all` builds them from a
scenario for the three systems of the paper's Table 6.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError, InfeasibleError
from prfaas.models.profile import DecodeTime, KVSize, PrefillTime
from prfaas.planner.throughput import bounds, decode_rate, mean_service_s, stage_curves
from prfaas.planner.ttft import ttft_stats
from prfaas.scenario import Scenario
from prfaas.workload.lengths import LengthDistribution

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
GBPS = 1e9 / 8  # bytes/s per Gbps


@dataclass(frozen=True)
class PlanInputs:
    lengths: LengthDistribution
    output_tokens: int
    kv: KVSize
    prfaas_prefill: PrefillTime
    pd_prefill: PrefillTime
    decode: DecodeTime
    n_prfaas: int
    n_pd: int
    link_gbps: float
    intra_gbps: float = 800.0
    t_step_tokens: int = 100
    link_rtt_s: float = 0.0  # added to the TTFT of a PrfaaS-routed request


@dataclass(frozen=True)
class SystemPlan:
    """One system's optimum. Stage rates in requests/s; None where a stage does not exist."""

    system: str
    lambda_max: float
    n_prfaas: int | None
    n_p: int | None
    n_d: int
    theta_prfaas: float | None
    theta_pd_p: float | None
    theta_pd_d: float
    threshold_tokens: int | None = None
    offload_fraction: float | None = None
    l_long_tokens: float | None = None
    l_short_tokens: float | None = None
    egress_gbps: float | None = None
    ttft_mean_s: float | None = None
    ttft_p90_s: float | None = None
    bottleneck: str = ""
    cost_per_hour: float | None = None  # from the scenario's cost_per_gpu_hour, when given
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        out.pop("system")
        return out


@dataclass(frozen=True)
class PlanResult:
    mode: str
    systems: dict[str, SystemPlan]
    search_points: int


def _check(inputs: PlanInputs) -> None:
    """Reject inputs no plan can be made of; whether a plan exists is the model's to say."""
    if inputs.n_pd < 1:
        raise InfeasibleError(f"clusters.pd.instances={inputs.n_pd}: no decode instance "
                              "(binding constraint: pd_d)")
    if inputs.n_prfaas < 0:
        raise ConfigError("clusters.prfaas.instances", inputs.n_prfaas, "must be >= 0")
    if not inputs.link_gbps >= 0 or not np.isfinite(inputs.link_gbps):
        raise ConfigError("link.gbps", inputs.link_gbps, "must be a finite number >= 0")
    if inputs.output_tokens < 1:
        raise ConfigError("workload.output_tokens", inputs.output_tokens, "must be >= 1")
    step_s = inputs.decode.step_at(inputs.decode.bs_max)
    if not 0 < step_s < np.inf:
        raise ConfigError("decode.step_s", step_s, "the step at bs_max must be positive")


def threshold_grid(lengths: LengthDistribution, step_tokens: int) -> np.ndarray:
    """t from just below the shortest request (everything offloaded) to the longest (none)."""
    if step_tokens <= 0:
        raise InfeasibleError(f"planner.t_step_tokens={step_tokens}: must be positive")
    first = -(-lengths.lo // step_tokens) * step_tokens
    inner = np.arange(first, lengths.hi, step_tokens, dtype=float)
    return np.unique(np.concatenate([[max(lengths.lo - 1, 0)], inner, [lengths.hi]]))


def search_prfaas_pd(inputs: PlanInputs, mode: str) -> SystemPlan:
    """Best (t, N_p) for PrfaaS-PD; ties broken by Eq. 7 balance, then less egress.

    Every term is finite or +inf (`bounds` excludes empty sides), so no NaN reaches the
    comparisons below; an InfeasibleError names the stage that is zero at every candidate."""
    _check(inputs)
    ts = threshold_grid(inputs.lengths, inputs.t_step_tokens)
    curves = stage_curves(inputs.lengths, ts, inputs.prfaas_prefill, inputs.pd_prefill,
                          inputs.kv, mode)
    link_bps = inputs.link_gbps * GBPS
    best: tuple[float, float, float] | None = None
    choice: tuple[int, int] = (0, 1)
    zero: set[str] = set()
    for n_p in range(0, inputs.n_pd):
        theta_d = _decode_rate(inputs, inputs.n_pd - n_p)
        _, _, prf_term, pdp_term = bounds(curves, inputs.n_prfaas, n_p, link_bps)
        lam = np.minimum(np.minimum(prf_term, pdp_term), theta_d)
        assert not np.isnan(lam).any(), f"NaN throughput at N_p={n_p}: bounds() let one through"
        zero |= {name for name, term in (("prfaas", prf_term), ("pd_p", pdp_term))
                 if (term <= 0).any()}
        top = float(lam.max())
        if not top > 0:
            continue
        imbalance = _imbalance(prf_term, pdp_term)
        for i in np.flatnonzero(lam >= top * (1 - 1e-9)):
            key = (float(lam[i]), -float(imbalance[i]), -float(curves.p_long[i]))
            if best is None or key > best:
                best, choice = key, (int(i), n_p)
    if best is None:
        raise InfeasibleError(_infeasible_reason(inputs, zero))
    return _prfaas_plan(inputs, curves, choice, mode)


@dataclass(frozen=True, slots=True)
class SplitOptimum:
    """The best t for one fixed split (N_prfaas, N_p, N_d): Λ = min of the three Eq. 6 terms."""

    n_p: int
    n_d: int
    lambda_rps: float  # 0.0 when no t gives a positive throughput
    threshold_tokens: int
    offload_fraction: float  # P(L > t)


def split_optimum(inputs: PlanInputs, curves: Any, n_prfaas: int, n_p: int, n_d: int
                  ) -> SplitOptimum:
    """`search_prfaas_pd`'s choice of t for this split (same ties: Eq. 7 balance, then less
    egress), from the stage curves of `inputs.lengths` (`stage_curves`, computed once for every
    split a caller compares)."""
    theta_d = _decode_rate(inputs, n_d) if n_d > 0 else 0.0
    _, _, prf_term, pdp_term = bounds(curves, n_prfaas, n_p, inputs.link_gbps * GBPS)
    lam = np.minimum(np.minimum(prf_term, pdp_term), theta_d)
    top = float(lam.max())
    if not top > 0:
        return SplitOptimum(n_p, n_d, 0.0, int(curves.thresholds[-1]), 0.0)
    imbalance = _imbalance(prf_term, pdp_term)
    best_key: tuple[float, float, float] | None = None
    best_i = 0
    for i in np.flatnonzero(lam >= top * (1 - 1e-9)):
        key = (float(lam[i]), -float(imbalance[i]), -float(curves.p_long[i]))
        if best_key is None or key > best_key:
            best_key, best_i = key, int(i)
    return SplitOptimum(n_p, n_d, float(lam[best_i]), int(curves.thresholds[best_i]),
                        float(curves.p_long[best_i]))


def _decode_rate(inputs: PlanInputs, n_d: int) -> float:
    return float(decode_rate(n_d, inputs.decode.bs_max, inputs.decode.step_at(
        inputs.decode.bs_max), inputs.output_tokens))


def _imbalance(prf_term: np.ndarray, pdp_term: np.ndarray) -> np.ndarray:
    """|log(prfaas term / pd-p term)| (Eq. 7); 1e9 where a term is 0 or +inf."""
    both = (prf_term > 0) & (pdp_term > 0) & np.isfinite(prf_term) & np.isfinite(pdp_term)
    out = np.full_like(prf_term, 1e9)
    out[both] = np.abs(np.log(prf_term[both] / pdp_term[both]))
    return out


def _infeasible_reason(inputs: PlanInputs, zero: set[str]) -> str:
    """Name the stages whose capacity is 0 wherever requests reach them."""
    why = {"prfaas": f"PrfaaS side Θprfaas = 0 (clusters.prfaas.instances={inputs.n_prfaas}, "
                     f"link.gbps={inputs.link_gbps})",
           "pd_p": f"PD-P side Θpd-p = 0 (N_p = 0: clusters.pd.instances={inputs.n_pd} "
                   "keeps every instance for decode)"}
    named = "; ".join(why[k] for k in sorted(zero)) or "no stage is zero (a bug)"
    return f"no threshold and split gives a positive throughput; binding constraint: {named}"


def _prfaas_plan(inputs: PlanInputs, curves: Any, choice: tuple[int, int], mode: str
                 ) -> SystemPlan:
    i, n_p = choice
    n_d = inputs.n_pd - n_p
    link_bps = inputs.link_gbps * GBPS
    theta_prf, theta_pdp, prf_term, pdp_term = bounds(curves, inputs.n_prfaas, n_p, link_bps)
    theta_d = _decode_rate(inputs, n_d)
    terms = {"prfaas": float(prf_term[i]), "pd_p": float(pdp_term[i]), "pd_d": theta_d}
    lam = min(terms.values())
    p, p_short = float(curves.p_long[i]), float(curves.p_short[i])
    t = int(curves.thresholds[i])
    service_s = float(curves.long_service_s[i])
    compute_bound = inputs.n_prfaas / service_s if p > 0 and service_s > 0 else np.inf
    ttft = ttft_stats(inputs, t)
    return SystemPlan(
        system="prfaas_pd", lambda_max=lam, n_prfaas=inputs.n_prfaas, n_p=n_p, n_d=n_d,
        theta_prfaas=float(theta_prf[i]), theta_pd_p=float(theta_pdp[i]), theta_pd_d=theta_d,
        threshold_tokens=t, offload_fraction=p,
        l_long_tokens=float(curves.l_long[i]) if p > 0 else None,
        l_short_tokens=float(curves.l_short[i]) if p_short > 0 else None,
        egress_gbps=lam * p * float(curves.long_kv_bytes[i]) * 8 / 1e9 if p > 0 else 0.0,
        ttft_mean_s=ttft[0], ttft_p90_s=ttft[1],
        bottleneck=min(terms, key=lambda k: terms[k]),
        extra={"prfaas_limited_by": "compute" if compute_bound <= float(theta_prf[i]) * 1.0000001
               else "bandwidth", "mode": mode},
    )


def search_homogeneous(inputs: PlanInputs, n_total: int, mode: str) -> SystemPlan:
    """Homogeneous PD on `n_total` instances of the PD hardware: best N_p:N_d."""
    if n_total < 2:
        raise InfeasibleError(f"baselines.homogeneous_pd.instances={n_total}: need at least 2")
    service = mean_service_s(inputs.lengths, inputs.pd_prefill, mode)
    best: SystemPlan | None = None
    for n_p in range(1, n_total):
        theta_p = n_p / service
        theta_d = float(decode_rate(n_total - n_p, inputs.decode.bs_max,
                                    inputs.decode.step_at(inputs.decode.bs_max),
                                    inputs.output_tokens))
        lam = min(theta_p, theta_d)
        if best is None or lam > best.lambda_max * (1 + 1e-12):
            ttft = ttft_stats(inputs, None, local_only=True)
            best = SystemPlan("homogeneous_pd", lam, None, n_p, n_total - n_p, None, theta_p,
                              theta_d, ttft_mean_s=ttft[0], ttft_p90_s=ttft[1],
                              bottleneck="pd_p" if theta_p <= theta_d else "pd_d")
    assert best is not None
    return best


def search_naive(inputs: PlanInputs, n_prefill: int, n_decode: int, mode: str) -> SystemPlan:
    """All prefill on the PrfaaS hardware, all decode on the PD hardware, no routing."""
    if n_prefill < 1 or n_decode < 1:
        raise InfeasibleError(f"naive_heterogeneous prefill={n_prefill} decode={n_decode}: "
                              "need at least one of each")
    service = mean_service_s(inputs.lengths, inputs.prfaas_prefill, mode)
    kv_bytes = inputs.kv.bytes_for(inputs.lengths.mean())
    theta_prf = min(n_prefill / service, inputs.link_gbps * GBPS / kv_bytes)
    theta_d = float(decode_rate(n_decode, inputs.decode.bs_max,
                                inputs.decode.step_at(inputs.decode.bs_max), inputs.output_tokens))
    lam = min(theta_prf, theta_d)
    if not lam > 0:
        raise InfeasibleError(f"naive_heterogeneous: no positive throughput; binding constraint: "
                              f"prfaas (link.gbps={inputs.link_gbps} carries every request's KV)")
    ttft = ttft_stats(inputs, -1)
    return SystemPlan("naive_heterogeneous", lam, n_prefill, None, n_decode, theta_prf, None,
                      theta_d, offload_fraction=1.0, egress_gbps=lam * kv_bytes * 8 / 1e9,
                      ttft_mean_s=ttft[0], ttft_p90_s=ttft[1],
                      bottleneck="prfaas" if theta_prf <= theta_d else "pd_d")


def inputs_from_scenario(s: Scenario) -> PlanInputs:
    return PlanInputs(
        lengths=s.lengths, output_tokens=s.output_tokens, kv=s.wire_kv,
        prfaas_prefill=s.prfaas.hardware.require_prefill(),
        pd_prefill=s.pd.hardware.require_prefill(), decode=s.pd.hardware.require_decode(),
        n_prfaas=s.prfaas.instances, n_pd=s.pd.instances,
        link_gbps=s.tcp.effective_gbps(s.link_gbps), link_rtt_s=s.tcp.rtt_s,
        intra_gbps=s.intra_gbps, t_step_tokens=s.t_step_tokens,
    )


def plan_all(s: Scenario, mode: str | None = None,
             only: Collection[str] | None = None) -> PlanResult:
    """The three systems of Table 6 for scenario `s` (with `only`, just those named: a
    simulation of one system needs no search of the others, which at 10K GPUs take seconds)."""
    mode = mode or s.mode
    inputs = inputs_from_scenario(s)
    wanted = set(SYSTEMS if only is None else only)
    systems: dict[str, SystemPlan] = {}
    if "prfaas_pd" in wanted:
        systems["prfaas_pd"] = search_prfaas_pd(inputs, mode)
    if "homogeneous_pd" in wanted:
        systems["homogeneous_pd"] = search_homogeneous(
            PlanInputs(**{**inputs.__dict__,
                          "pd_prefill": s.homogeneous.hardware.require_prefill(),
                          "decode": s.homogeneous.hardware.require_decode()}),
            s.homogeneous.instances, mode)
    if "naive_heterogeneous" in wanted:
        systems["naive_heterogeneous"] = search_naive(
            PlanInputs(**{**inputs.__dict__,
                          "prfaas_prefill": s.naive_prefill.hardware.require_prefill(),
                          "decode": s.naive_decode.hardware.require_decode()}),
            s.naive_prefill.instances, s.naive_decode.instances, mode)
    points = threshold_grid(s.lengths, s.t_step_tokens).size * s.pd.instances
    costs = {"prfaas_pd": (s.prfaas, s.pd), "homogeneous_pd": (s.homogeneous,),
             "naive_heterogeneous": (s.naive_prefill, s.naive_decode)}
    for name, pools in costs.items():
        if name not in systems:
            continue
        per_pool = [p.cost_per_hour for p in pools]
        if all(c is not None for c in per_pool):
            systems[name] = replace(systems[name], cost_per_hour=sum(c or 0.0 for c in per_pool))
    return PlanResult(mode, systems, points)
