"""Runs of the multi-cluster simulator: setup from a plan, workloads, per-cluster metrics,
capacity search and the fairness experiment.

Metrics per PD cluster, as the one-cluster simulator's (sim/metrics.py): throughput_rps =
completions inside the steady window [first arrival + span/4, last arrival] over its length;
ttft = arrival to KV at the decoder; egress_gbps = KV bytes sent to that cluster from its first
arrival to its last remote KV arrival (the span its link carried them in); queue growth = mean
requests in its system seen by arrivals in the last quarter minus the second quarter. A cluster
sustains its rate when throughput >= 98% of it and its queue does not grow (sim/capacity.py's
rule); the system sustains a rate vector when every cluster does. Capacity is searched along
the plan's mix (rates s x lambda_k of the plan; capacity = s* x sum lambda_k), with the
one-cluster bracket-then-bisect search and the same seed per probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.planner.regions import MultiPlan
from prfaas.scenario import Scenario
from prfaas.sim.capacity import search_rates
from prfaas.sim.regions import RegionsConfig, RegionSetup, RegionsSimulator
from prfaas.workload.arrivals import ArrivalProcess, check_rate, make_arrivals
from prfaas.workload.requests import Workload, synthetic

THROUGHPUT_SHARE = 0.98


def build_regions(s: Scenario, plan: MultiPlan, share_policy: str = "drr",
                  controller: bool = True) -> RegionsConfig:
    """The simulated system of a PrfaaS-PD multi-cluster plan."""
    regions = []
    for r in s.pd_clusters:
        p = plan.pd_clusters[r.name]
        d = r.pool.hardware.require_decode()
        tokens_rps = p.lambda_max * p.offload_fraction * (p.l_long_tokens or 0.0)
        regions.append(RegionSetup(
            name=r.name, threshold_tokens=int(p.threshold_tokens or r.lengths.hi),
            max_tokens=r.lengths.hi, min_tokens=max(r.lengths.lo - 1, 0), n_p=p.n_p or 0,
            n_d=p.n_d, bs_max=d.bs_max,
            step_s=d.step_at(d.bs_max), pd_prefill=r.pool.hardware.require_prefill(),
            link_gbps=r.tcp.effective_gbps(r.link_gbps),
            flow_cap_gbps=r.tcp.transfer_cap_gbps(), rtt_s=r.tcp.rtt_s,
            budget_gbps=r.usable_gbps, share_instances=p.prfaas_instances,
            share_weight=tokens_rps))
    return RegionsConfig(tuple(regions), s.prfaas.instances,
                         s.prfaas.hardware.require_prefill(), s.kv, s.intra_gbps,
                         share_policy, controller)


def region_workloads(s: Scenario, rates: Mapping[str, float], arrivals: ArrivalProcess,
                     *, requests: int | None = None, duration_s: float | None = None,
                     seed: int = 0) -> dict[str, Workload]:
    """One synthetic workload per PD cluster: `requests` split in proportion to the rates, or
    `duration_s` of arrivals at each rate; stratified lengths, seed + index per cluster."""
    out = {}
    total = sum(rates.values())
    for k, r in enumerate(s.pd_clusters):
        if r.name not in rates:
            raise UnknownNameError("--rate-of", r.name, list(rates))
        rate = check_rate(rates[r.name], f"rate of {r.name}")
        n = round(rate * duration_s) if duration_s is not None \
            else round((requests or 2000) * rate / total)
        out[r.name] = synthetic(r.lengths, r.output_tokens, arrivals, rate, max(n, 20),
                                seed * 1000 + k, stratified=True)
    return out


def simulate_regions(cfg: RegionsConfig, workloads: Mapping[str, Workload]
                     ) -> dict[str, Any]:
    sim = RegionsSimulator(cfg, workloads).run()
    clusters = {reg.setup.name: _cluster_metrics(reg) for reg in sim.regions}
    busy = sum(reg.busy_prfaas_s for reg in sim.regions)
    span = max(sim.now_s, 1e-9)
    return {"share_policy": cfg.share_policy, "controller": cfg.controller,
            "throughput_rps": round(sum(c["throughput_rps"] for c in clusters.values()), 6),
            "prfaas": {"utilization": round(busy / (cfg.n_prfaas * span), 4) if cfg.n_prfaas
                       else None,
                       "busy_share": {reg.setup.name: round(reg.busy_prfaas_s / busy, 4)
                                      if busy else 0.0 for reg in sim.regions}},
            "pd_clusters": clusters, "events": sim.events, "simulated_s": round(sim.now_s, 3)}


def _pct(values: np.ndarray, q: float) -> float | None:
    ok = values[np.isfinite(values)]
    return round(float(np.percentile(ok, q)), 6) if ok.size else None


def _cluster_metrics(reg: Any) -> dict[str, Any]:
    arr = reg.work.arrival_s
    first, last = float(arr[0]), float(arr[-1])
    start = first + (last - first) / 4
    done = reg.finish[np.isfinite(reg.finish)]
    width = last - start
    throughput = float(((done >= start) & (done <= last)).sum()) / width if width > 0 else 0.0
    n = arr.size
    seen = reg.in_system_seen
    q2, q4 = seen[n // 4: n // 2], seen[3 * n // 4:]
    growth = float(q4.mean() - q2.mean()) if q2.size and q4.size else 0.0
    ttft = reg.kv_at - arr
    offered = reg.work.offered_rps()
    span = max(last - first, 1e-9)
    setup = reg.setup
    utilization = {  # offered work over capacity, from first to last arrival
        "pd_p": round(float(reg.local_s[~reg.offloaded].sum()) / (setup.n_p * span), 4)
        if setup.n_p else None,
        "decode": round(float(reg.work.output_tokens.sum()) * setup.step_s
                        / (setup.n_d * setup.bs_max * span), 4) if setup.n_d else None,
        "prfaas_instances": round(float(reg.prfaas_s[reg.offloaded].sum()) / span, 4)}
    remote_end = reg.kv_at[reg.offloaded]
    egress_end = float(np.nanmax(remote_end)) if np.isfinite(remote_end).any() else last
    return {"offered_rps": round(offered, 6), "throughput_rps": round(throughput, 6),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90),
            "ttft_mean_s": round(float(np.nanmean(ttft)), 6) if np.isfinite(ttft).any()
            else None,
            "offload_fraction": round(float(reg.offloaded.mean()), 6),
            "egress_gbps": round(reg.link.bytes_sent * 8 / 1e9 / max(egress_end - first, 1e-9),
                                 4),
            "budget_gbps": setup.budget_gbps, "budget_held": reg.held,
            "threshold_tokens_last": reg.control.threshold_tokens,
            "threshold_changes": reg.control.changes,
            "requests": int(n), "completed": int(done.size),
            "queue_growth": round(growth, 3), "in_system_mean": round(float(seen.mean()), 3),
            "utilization": utilization,
            "sustainable": bool(throughput >= THROUGHPUT_SHARE * offered
                                and growth <= max(10.0, 0.1 * float(seen.mean())))}


def find_region_capacity(s: Scenario, plan: MultiPlan, cfg: RegionsConfig, *,
                         requests: int = 4000, seed: int = 0, arrivals: str = "uniform",
                         rel_tol: float = 0.005, max_probes: int = 24) -> dict[str, Any]:
    """Highest scale s of the plan's rate vector every cluster sustains (module docstring)."""
    process = make_arrivals(arrivals)
    base = {name: p.lambda_max for name, p in plan.pd_clusters.items()}
    probes: list[dict[str, Any]] = []
    search = search_rates(1.0, rel_tol, max_probes)
    try:
        scale = next(search)
        while True:
            rates = {k: v * scale for k, v in base.items()}
            summary = simulate_regions(cfg, region_workloads(s, rates, process,
                                                             requests=requests, seed=seed))
            ok = all(c["sustainable"] for c in summary["pd_clusters"].values())
            probes.append({"scale": round(scale, 6), "sustainable": ok,
                           "throughput_rps": summary["throughput_rps"]})
            scale = search.send(ok)
    except StopIteration as done:
        best = float(done.value)
    return {"max_rps": round(best * sum(base.values()), 4), "scale": round(best, 6),
            "planned_rps": round(sum(base.values()), 4),
            "max_rps_of": {k: round(v * best, 4) for k, v in base.items()},
            "requests": requests, "seed": seed, "arrivals": arrivals, "probes": probes}


def saturation_capacity(s: Scenario, plan: MultiPlan, cfg: RegionsConfig, *,
                        overload: float = 1.2, requests: int = 16000, seed: int = 0,
                        arrivals: str = "uniform") -> dict[str, Any]:
    """Capacity as the fluid plan defines it (Eq. 6: the most each stage completes): every
    cluster offered `overload` x its planned rate, so every critical stage is saturated, and
    the completions per second in the steady window read off per cluster. No queue test: a
    saturated system's queue grows by construction; what is compared is throughput. Run with
    `cfg.controller` off to hold t at the plan's (with it on, overload moves t)."""
    if not overload > 1:
        raise ConfigError("overload", overload, "must be > 1 (every stage saturated)")
    base = {name: p.lambda_max for name, p in plan.pd_clusters.items()}
    summary = simulate_regions(cfg, region_workloads(
        s, {k: v * overload for k, v in base.items()}, make_arrivals(arrivals),
        requests=requests, seed=seed))
    of = {k: c["throughput_rps"] for k, c in summary["pd_clusters"].items()}
    total = sum(of.values())
    return {"max_rps": round(total, 4), "planned_rps": round(sum(base.values()), 4),
            "vs_plan": round(total / sum(base.values()) - 1, 4),
            "max_rps_of": {k: round(v, 4) for k, v in of.items()},
            "vs_plan_of": {k: round(of[k] / base[k] - 1, 4) for k in base},
            "overload": overload, "controller": cfg.controller, "requests": requests,
            "seed": seed, "arrivals": arrivals}


def fairness_runs(s: Scenario, plan: MultiPlan, *, load: float = 0.85, overload: float = 3.0,
                  duration_s: float = 900.0, seed: int = 0) -> dict[str, Any]:
    """Each cluster in turn offers `overload` x its planned rate while the others offer `load`
    x theirs; each run beside the fair one (all at `load`), with DRR and with FCFS (the
    negative control). Per victim: its throughput and P90 TTFT relative to the fair run."""
    process = make_arrivals("uniform")
    base = {name: p.lambda_max for name, p in plan.pd_clusters.items()}
    out: dict[str, Any] = {"load": load, "overload": overload, "duration_s": duration_s,
                           "seed": seed, "policies": {}}
    for policy in ("drr", "fcfs"):
        cfg = build_regions(s, plan, policy)
        fair = simulate_regions(cfg, region_workloads(
            s, {k: v * load for k, v in base.items()}, process, duration_s=duration_s,
            seed=seed))
        runs = {}
        for hog in base:
            rates = {k: v * (overload if k == hog else load) for k, v in base.items()}
            run = simulate_regions(cfg, region_workloads(s, rates, process,
                                                         duration_s=duration_s, seed=seed))
            runs[hog] = {"pd_clusters": run["pd_clusters"], "victims": {
                k: fairness_relative(run["pd_clusters"][k], fair["pd_clusters"][k])
                for k in base if k != hog}}
        out["policies"][policy] = {"fair": fair["pd_clusters"], "overloaded": runs}
    return out


def fairness_relative(run: Mapping[str, Any], fair: Mapping[str, Any]) -> dict[str, Any]:
    """A victim region's throughput and P90 TTFT relative to its fair run, and whether the
    issue's bound holds (>= 90% throughput, P90 within 1.25x): one rule, simulated and live."""
    thr = run["throughput_rps"] / fair["throughput_rps"] if fair["throughput_rps"] else None
    p90 = (run["ttft_p90_s"] / fair["ttft_p90_s"]
           if run["ttft_p90_s"] is not None and fair["ttft_p90_s"] else None)
    return {"throughput_ratio": None if thr is None else round(thr, 4),
            "ttft_p90_ratio": None if p90 is None else round(p90, 4),
            "holds": bool(thr is not None and p90 is not None and thr >= 0.9 and p90 <= 1.25)}
