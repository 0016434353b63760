"""The throughput model for K PD clusters sharing one PrfaaS cluster (issue 22).

Each PD cluster k has its own instances n_k (split N_p^k + N_d^k), its own length mix L_k,
output length and link B_k (the TCP-effective rate, capped by its egress budget). The PrfaaS
cluster's N instances are shared: cluster k gets a share c_k (instances, fractional: a share of
the pool's time), sum c_k <= N. Given c_k, cluster k is the paper's one-cluster model (Eqs 3-6):

    lambda_k(c_k) = max over t_k, N_p^k of min( min(c_k / T_prfaas(l_long), B_k / S(l_long)) / p,
                                                N_p^k / T_pd(l_short) / (1 - p),
                                                N_d^k BS_max / (T_decode L_out) )

(`paper` mode: T at the conditional mean length; `exact`: E[T(L) | side], planner/throughput.py).
Every constraint of cluster k involves only c_k and cluster k's own link, so the K clusters
couple only through sum c_k <= N. Objectives:
- `throughput`: maximise sum_k lambda_k(c_k) subject to sum c_k <= N;
- `fair` (weighted): maximise alpha subject to lambda_k(c_k) >= alpha w_k for every k, then
  spend any PrfaaS time left on the throughput objective with those floors kept.
Both are solved exactly on a grid of c (N / GRID steps) by dynamic programming over clusters
(lambda_k(c) is nondecreasing but not concave, so a greedy split could miss the optimum).

Baselines under the same objective: `alone` (each PD cluster homogeneous PD on its own
instances and traffic, no PrfaaS), `all_remote` (every prefill on the PrfaaS cluster, every PD
instance decodes: Dynamo's cross-cluster example) and `whole_request_routing` (each request goes
whole to one cluster, the PrfaaS instances replaced by a PD cluster of the scenario's choosing:
the peers' multi-cluster routers). Whole-request routing is the fluid LP over routing fractions
x_ck (cluster c serving region k uses x_ck / cap_ck of its time, cap_ck = c's homogeneous
capacity on k's mix with its best split for that mix): an upper bound on what such a router
achieves, so the comparison favours the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError, InfeasibleError
from prfaas.planner.search import GBPS, PlanInputs, threshold_grid
from prfaas.planner.throughput import decode_rate, mean_service_s, stage_curves
from prfaas.scenario import PdCluster, Scenario

OBJECTIVES = ("throughput", "fair")
GRID = 400  # PrfaaS share steps over [0, N]


@dataclass(frozen=True)
class RegionPlan:
    """One PD cluster's part of a multi-cluster plan. `prfaas_instances` is its planned share
    of the PrfaaS pool's time, in instances."""

    lambda_max: float
    n_p: int | None
    n_d: int
    threshold_tokens: int | None = None
    prfaas_instances: float = 0.0
    offload_fraction: float = 0.0
    egress_gbps: float = 0.0
    link_gbps: float = 0.0
    l_long_tokens: float | None = None
    bottleneck: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class MultiPlan:
    system: str
    lambda_max: float
    pd_clusters: dict[str, RegionPlan]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"lambda_max": self.lambda_max, **self.extra,
                "pd_clusters": {k: v.to_json() for k, v in self.pd_clusters.items()}}


@dataclass(frozen=True)
class _Curve:
    """lambda_k on the share grid, with the argmax (threshold index, N_p) at each point."""

    shares: np.ndarray
    lam: np.ndarray
    t_index: np.ndarray
    n_p: np.ndarray


def region_inputs(s: Scenario, r: PdCluster, n_prfaas: int) -> PlanInputs:
    """The one-cluster planner's inputs for PD cluster `r` (the K = 1 case of this model)."""
    return PlanInputs(lengths=r.lengths, output_tokens=r.output_tokens, kv=s.kv,
                      prfaas_prefill=s.prfaas.hardware.require_prefill(),
                      pd_prefill=r.pool.hardware.require_prefill(),
                      decode=r.pool.hardware.require_decode(), n_prfaas=n_prfaas,
                      n_pd=r.pool.instances, link_gbps=r.usable_gbps, link_rtt_s=r.tcp.rtt_s,
                      intra_gbps=s.intra_gbps, t_step_tokens=s.t_step_tokens)


def _theta_d(inputs: PlanInputs, n_d: np.ndarray | int) -> np.ndarray:
    d = inputs.decode
    return decode_rate(n_d, d.bs_max, d.step_at(d.bs_max), inputs.output_tokens)


def prfaas_curve(inputs: PlanInputs, shares: np.ndarray, mode: str) -> _Curve:
    """lambda(c) for every share c: the one-cluster search (Eq. 6 over t and N_p) at each c."""
    ts = threshold_grid(inputs.lengths, inputs.t_step_tokens)
    cv = stage_curves(inputs.lengths, ts, inputs.prfaas_prefill, inputs.pd_prefill, inputs.kv,
                      mode)
    long, short = cv.p_long > 0, cv.p_short > 0
    # per unit of share / of N_p; 0 on an empty side, whose term is then +inf (never binds)
    per_share = _ratio(1.0, cv.long_service_s * cv.p_long, long)
    link = _ratio(inputs.link_gbps * GBPS, cv.long_kv_bytes * cv.p_long, long)
    per_np = _ratio(1.0, cv.short_service_s * cv.p_short, short)
    prf = np.where(long[None, :], np.minimum(np.outer(shares, per_share), link[None, :]), np.inf)
    best = np.full(shares.size, -1.0)
    t_idx = np.zeros(shares.size, dtype=int)
    n_ps = np.zeros(shares.size, dtype=int)
    for n_p in range(inputs.n_pd):
        pdp = np.where(short, n_p * per_np, np.inf)
        lam = np.minimum(np.minimum(prf, pdp[None, :]), float(_theta_d(inputs, inputs.n_pd - n_p)))
        lam = np.where(np.isfinite(lam), lam, 0.0)  # a cluster with no requests anywhere
        i = lam.argmax(axis=1)
        top = lam[np.arange(shares.size), i]
        better = top > best * (1 + 1e-12)
        best = np.where(better, top, best)
        t_idx = np.where(better, i, t_idx)
        n_ps = np.where(better, n_p, n_ps)
    return _Curve(shares, np.maximum(best, 0.0), t_idx, n_ps)


def _ratio(num: float, den: np.ndarray, where: np.ndarray) -> np.ndarray:
    """num / den where `where` and den > 0, +inf where den == 0 there, 0 elsewhere."""
    out = np.zeros_like(den)
    ok = where & (den > 0)
    np.divide(num, den, out=out, where=ok)
    out[where & (den <= 0)] = np.inf
    return out


def all_remote_curve(inputs: PlanInputs, shares: np.ndarray, mode: str) -> np.ndarray:
    """lambda(c) with every prefill remote and every PD instance decoding."""
    service = mean_service_s(inputs.lengths, inputs.prfaas_prefill, mode)
    link = inputs.link_gbps * GBPS / inputs.kv.bytes_for(inputs.lengths.mean())
    return np.minimum(np.minimum(shares / service, link),
                      float(_theta_d(inputs, inputs.n_pd)))


def split_shares(curves: Sequence[np.ndarray], steps: int, objective: str,
                 weights: Sequence[float]) -> list[int]:
    """Grid steps of the PrfaaS pool for each cluster (sum <= steps) under `objective`."""
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, f"must be one of {list(OBJECTIVES)}")
    floors = [np.zeros(steps + 1)] * len(curves)
    if objective == "fair":
        alpha = _fair_alpha(curves, steps, weights)
        floors = [np.full(steps + 1, alpha * w * (1 - 1e-9)) for w in weights]
    return _dp(curves, steps, floors)


def _need(curve: np.ndarray, rate: float) -> int | None:
    """Fewest grid steps at which `curve` reaches `rate` (None: never)."""
    hit = np.flatnonzero(curve >= rate)
    return int(hit[0]) if hit.size else None


def _fair_alpha(curves: Sequence[np.ndarray], steps: int, weights: Sequence[float]) -> float:
    """Largest alpha with lambda_k >= alpha w_k for all k within the pool (bisection)."""
    lo, hi = 0.0, min(float(c[-1]) / w for c, w in zip(curves, weights, strict=True))
    for _ in range(60):
        mid = (lo + hi) / 2
        needs = [_need(c, mid * w) for c, w in zip(curves, weights, strict=True)]
        if all(n is not None for n in needs) and sum(n or 0 for n in needs) <= steps:
            lo = mid
        else:
            hi = mid
    return lo


def _dp(curves: Sequence[np.ndarray], steps: int, floors: Sequence[np.ndarray]) -> list[int]:
    """Maximise sum_k curve_k[s_k] with sum s_k <= steps and curve_k[s_k] >= floor_k."""
    best = np.zeros(steps + 1)  # best[b]: total using at most b steps
    picks: list[np.ndarray] = []
    for curve, floor in zip(curves, floors, strict=True):
        value = np.where(curve >= floor, curve, -np.inf)
        # new[b] = max_s best[b - s] + value[s]
        table = np.full((steps + 1, steps + 1), -np.inf)
        for s in range(steps + 1):
            table[s:, s] = best[: steps + 1 - s] + value[s]
        pick = table.argmax(axis=1)
        best = table[np.arange(steps + 1), pick]
        picks.append(pick)
    if not np.isfinite(best[steps]):
        raise InfeasibleError("no split of the PrfaaS cluster meets every PD cluster's floor")
    out, budget = [], steps
    for pick in reversed(picks):
        s = int(pick[budget])
        out.append(s)
        budget -= s
    return out[::-1]
