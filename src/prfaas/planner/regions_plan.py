"""`plan_regions`: PrfaaS-PD for several PD clusters and its baselines (model: regions.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import linprog

from prfaas.core.errors import InfeasibleError
from prfaas.planner.regions import (
    GRID,
    MultiPlan,
    RegionPlan,
    all_remote_curve,
    prfaas_curve,
    region_inputs,
    split_shares,
)
from prfaas.planner.search import GBPS, PlanInputs, threshold_grid
from prfaas.planner.throughput import decode_rate, mean_service_s, stage_curves
from prfaas.scenario import PdCluster, Pool, Scenario

SYSTEMS = ("prfaas_pd", "whole_request_routing", "all_remote", "alone")


def plan_regions(s: Scenario, mode: str | None = None, objective: str = "throughput"
                 ) -> dict[str, MultiPlan]:
    """Every system of the multi-cluster table for scenario `s` (which has `pd_clusters`)."""
    if not s.pd_clusters:
        raise InfeasibleError(f"scenario {s.name} has no pd_clusters: use plan_all")
    mode = mode or s.mode
    weights = [r.tenant_weight for r in s.pd_clusters]
    return {"prfaas_pd": _prfaas_pd(s, mode, objective, weights),
            "whole_request_routing": _whole_request(s, mode, objective, weights),
            "all_remote": _all_remote(s, mode, objective, weights),
            "alone": _alone(s, mode)}


def _shares(s: Scenario) -> np.ndarray:
    return np.linspace(0.0, float(s.prfaas.instances), GRID + 1)


def _prfaas_pd(s: Scenario, mode: str, objective: str, weights: list[float]) -> MultiPlan:
    shares = _shares(s)
    inputs = [region_inputs(s, r, s.prfaas.instances) for r in s.pd_clusters]
    curves = [prfaas_curve(i, shares, mode) for i in inputs]
    picks = split_shares([c.lam for c in curves], GRID, objective, weights)
    out: dict[str, RegionPlan] = {}
    for r, inp, curve, k in zip(s.pd_clusters, inputs, curves, picks, strict=True):
        out[r.name] = _region_plan(inp, curve.lam[k], int(curve.t_index[k]), int(curve.n_p[k]),
                                   float(shares[k]), mode)
    return MultiPlan("prfaas_pd", sum(p.lambda_max for p in out.values()), out,
                     {"objective": objective, "mode": mode, "n_prfaas": s.prfaas.instances})


def _region_plan(inp: PlanInputs, lam: float, t_index: int, n_p: int, share: float, mode: str
                 ) -> RegionPlan:
    """The figures of one cluster at its chosen (t, N_p) and PrfaaS share."""
    ts = threshold_grid(inp.lengths, inp.t_step_tokens)
    cv = stage_curves(inp.lengths, ts[t_index:t_index + 1], inp.prfaas_prefill, inp.pd_prefill,
                      inp.kv, mode)
    p = float(cv.p_long[0])
    n_d = inp.n_pd - n_p
    d = inp.decode
    terms = {"prfaas_compute": share / float(cv.long_service_s[0]) / p if p > 0 else np.inf,
             "link": inp.link_gbps * GBPS / float(cv.long_kv_bytes[0]) / p if p > 0 else np.inf,
             "pd_p": n_p / float(cv.short_service_s[0]) / (1 - p) if p < 1 else np.inf,
             "pd_d": n_d * d.bs_max / (d.step_at(d.bs_max) * inp.output_tokens)}
    return RegionPlan(
        lambda_max=float(lam), n_p=n_p, n_d=n_d, threshold_tokens=int(ts[t_index]),
        prfaas_instances=float(lam * p * cv.long_service_s[0]), offload_fraction=p,
        egress_gbps=float(lam * p * cv.long_kv_bytes[0] * 8 / 1e9), link_gbps=inp.link_gbps,
        l_long_tokens=float(cv.l_long[0]) if p > 0 else None,
        bottleneck=min(terms, key=lambda k: terms[k]))


def _all_remote(s: Scenario, mode: str, objective: str, weights: list[float]) -> MultiPlan:
    shares = _shares(s)
    inputs = [region_inputs(s, r, s.prfaas.instances) for r in s.pd_clusters]
    curves = [all_remote_curve(i, shares, mode) for i in inputs]
    picks = split_shares(curves, GRID, objective, weights)
    out = {}
    for r, inp, curve, k in zip(s.pd_clusters, inputs, curves, picks, strict=True):
        kv = inp.kv.bytes_for(inp.lengths.mean())
        lam = float(curve[k])
        out[r.name] = RegionPlan(
            lambda_max=lam, n_p=None, n_d=inp.n_pd,
            prfaas_instances=lam * mean_service_s(inp.lengths, inp.prfaas_prefill, mode),
            offload_fraction=1.0, egress_gbps=lam * kv * 8 / 1e9, link_gbps=inp.link_gbps)
    return MultiPlan("all_remote", sum(p.lambda_max for p in out.values()), out,
                     {"objective": objective})


def _alone(s: Scenario, mode: str) -> MultiPlan:
    out = {}
    for r in s.pd_clusters:
        lam, n_p = homogeneous(region_inputs(s, r, 0), r.pool.instances, mode)
        out[r.name] = RegionPlan(lambda_max=lam, n_p=n_p, n_d=r.pool.instances - n_p)
    return MultiPlan("alone", sum(p.lambda_max for p in out.values()), out)


def homogeneous(inputs: PlanInputs, n_total: int, mode: str) -> tuple[float, int]:
    """Homogeneous PD capacity and N_p (search_homogeneous's optimum, without its TTFTs)."""
    service = mean_service_s(inputs.lengths, inputs.pd_prefill, mode)
    d = inputs.decode
    best = max((min(n_p / service, float(decode_rate(n_total - n_p, d.bs_max,
                                                     d.step_at(d.bs_max),
                                                     inputs.output_tokens))), n_p)
               for n_p in range(1, n_total))
    return best


def _homog_cap(s: Scenario, pool: Pool, r: PdCluster, mode: str) -> float:
    inputs = replace(region_inputs(s, r, 0), pd_prefill=pool.hardware.require_prefill(),
                     decode=pool.hardware.require_decode())
    return homogeneous(inputs, pool.instances, mode)[0]


def _whole_request(s: Scenario, mode: str, objective: str, weights: list[float]) -> MultiPlan:
    """Fluid LP over routing fractions (module docstring of regions.py)."""
    pools = [r.pool for r in s.pd_clusters]
    names = [r.name for r in s.pd_clusters]
    if s.whole_request_extra is not None:
        pools.append(s.whole_request_extra)
        names.append("prfaas-as-pd")
    cap = np.array([[_homog_cap(s, pool, r, mode) for r in s.pd_clusters] for pool in pools])
    x = _routing_lp(cap, objective, np.asarray(weights))
    served = x.sum(axis=0)
    out = {r.name: RegionPlan(lambda_max=float(served[k]), n_p=None, n_d=0)
           for k, r in enumerate(s.pd_clusters)}
    routing = {names[c]: {r.name: float(x[c, k]) for k, r in enumerate(s.pd_clusters)}
               for c in range(len(pools))}
    return MultiPlan("whole_request_routing", float(served.sum()), out,
                     {"objective": objective, "routing_rps": routing,
                      "capacity_rps": {names[c]: {r.name: float(cap[c, k]) for k, r in
                                                  enumerate(s.pd_clusters)}
                                       for c in range(len(pools))}})


def _routing_lp(cap: np.ndarray, objective: str, weights: np.ndarray) -> np.ndarray:
    """x[c, k] >= 0 with sum_k x[c, k] / cap[c, k] <= 1; max sum x (throughput) or max alpha
    with sum_c x[c, k] >= alpha w_k (fair). Variables: x flattened, then alpha."""
    n_c, n_k = cap.shape
    n_x = n_c * n_k
    a_ub: list[list[float]] = []
    b_ub: list[float] = []
    for c in range(n_c):
        row = [0.0] * (n_x + 1)
        for k in range(n_k):
            row[c * n_k + k] = 1.0 / cap[c, k]
        a_ub.append(row)
        b_ub.append(1.0)
    if objective == "fair":
        for k in range(n_k):
            row = [0.0] * (n_x + 1)
            for c in range(n_c):
                row[c * n_k + k] = -1.0
            row[n_x] = float(weights[k])
            a_ub.append(row)
            b_ub.append(0.0)
        cost = [0.0] * n_x + [-1.0]
    else:
        cost = [-1.0] * n_x + [0.0]
    res: Any = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * (n_x + 1),
                       method="highs")
    if not res.success:
        raise InfeasibleError(f"whole-request routing LP: {res.message}")
    return np.asarray(res.x[:n_x]).reshape(n_c, n_k)
