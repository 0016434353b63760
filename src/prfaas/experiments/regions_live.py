"""Several PD clusters sharing one PrfaaS cluster, live on emulated hardware (issue 22).

`regions_setup(scenario)` turns a multi-cluster scenario (`pd_clusters:`) and its plan
(planner/regions_plan.py, exact mode) into a `RegionsDeployment` (serve/deploy/regions.py): the
PrfaaS cluster's instances as emulated H200 workers behind the tenant gateway (serve/gateway.py,
the simulator's DRR and egress-budget objects), and per PD cluster its planned N_p PD-P and
N_d PD-D emulated workers, its router (`prfaas-threshold` at its planned t, in live tokens) and
its own kernel-shaped link at its rate. Units are scales.py's (`Scales`): live time = a x
scenario time, live tokens = scenario tokens / d, live bytes = b x scenario bytes; rates and
times below are reported in scenario units unless named `_live`. Not emulated live: the links'
RTT and loss (tc netem is not available on these kernels; the rate is shaped), and the
per-destination threshold controller (the routers keep the planned t; the simulator beside is
run with its controller off to match).

Runs: every region's load at once (bench.loadgen, one client per router), optional faults at
given times; per region and request: arrival, KV at the decoder (the decode worker's stamp,
as runs.py: the simulator's TTFT event), the client's first token, finish, route. The same
requests converted to scenario units run through the multi-cluster simulator
(`sim.regions_run.simulate_regions`) for the figures beside.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.bench.loadgen import Result, run_load
from prfaas.core.errors import ConfigError
from prfaas.emulated.backend import EmulatedEngineBackend, emulated_config
from prfaas.emulated.scales import ScaledScenario, Scales, scale_lengths, scale_scenario
from prfaas.experiments.runs import prompts
from prfaas.planner.regions import MultiPlan
from prfaas.planner.regions_plan import plan_regions
from prfaas.scenario import Scenario, load_scenario
from prfaas.serve.deploy.regions import GATEWAY, RegionsDeployment, RegionSpec
from prfaas.serve.gateway import GatewayConfig, TenantSpec
from prfaas.serve.resilience import AdmissionSpec
from prfaas.serve.topology import LinkSpec, Timeouts, Topology, WorkerSpec
from prfaas.sim.regions import RegionsSimulator
from prfaas.sim.regions_run import build_regions, fairness_relative, simulate_regions
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import Workload, synthetic

REQUEST_TIMEOUT_S = 900.0  # the routers' and the gateway's prefill wait
CLIENT_TIMEOUT_S = 300.0  # one request at the load generator (then counted failed)
CONNECTIONS = 4
QUANTUM_TOKENS = 8192.0  # the simulator's DRR quantum (scenario tokens)


@dataclass(frozen=True)
class RegionsSetup:
    scenario: Scenario  # the original (scenario units)
    path: str
    scaled: ScaledScenario
    plan: MultiPlan
    share_policy: str
    prfaas_workers: tuple[WorkerSpec, ...]
    prfaas_topology: Topology
    gateway: GatewayConfig
    regions: tuple[RegionSpec, ...]

    @property
    def a(self) -> float:
        return self.scaled.scales.time

    @property
    def model_name(self) -> str:
        return emulated_config(self.scaled).name

    def planned_rps(self) -> dict[str, float]:
        return {k: p.lambda_max for k, p in self.plan.pd_clusters.items()}

    def deployment(self, log_dir: Path | None = None) -> RegionsDeployment:
        return RegionsDeployment(self.prfaas_workers, self.prfaas_topology, self.gateway,
                                 list(self.regions), log_dir)

    def workloads(self, rates_rps: Mapping[str, float], duration_s: float, seed: int
                  ) -> dict[str, Workload]:
        """Per region `duration_s` scenario seconds of uniform arrivals at its rate (scenario
        req/s), in live units: lengths / d (scales.scale_lengths), times x a."""
        sc = self.scaled.scales
        out = {}
        for k, r in enumerate(self.scenario.pd_clusters):
            rate_live = rates_rps[r.name] / sc.time
            n = max(round(rates_rps[r.name] * duration_s), 4)
            out[r.name] = synthetic(scale_lengths(r.lengths, sc.tokens),
                                    r.output_tokens // sc.output, make_arrivals("uniform"),
                                    rate_live, n, seed * 1000 + k, stratified=True)
        return out

    def to_scenario_units(self, w: Workload) -> Workload:
        sc = self.scaled.scales
        return Workload(w.arrival_s / sc.time, w.input_tokens * sc.tokens,
                        w.output_tokens * sc.output, f"{w.source} (scenario units)")


def with_budgets(s: Scenario, budgets_gbps: Mapping[str, float | None]) -> Scenario:
    """`s` with these PD clusters' `egress_budget_gbps` (scenario Gbps; None: none)."""
    unknown = sorted(set(budgets_gbps) - {r.name for r in s.pd_clusters})
    if unknown:
        raise ConfigError("budgets", unknown[0], f"not a PD cluster of {s.name}")
    return replace(s, pd_clusters=tuple(
        replace(r, egress_budget_gbps=budgets_gbps[r.name]) if r.name in budgets_gbps else r
        for r in s.pd_clusters))


def regions_setup(scenario: str, scales: Scales | None = None, share_policy: str = "drr",
                  keys: Mapping[str, str] | None = None,
                  budgets_gbps: Mapping[str, float] | None = None) -> RegionsSetup:
    """`scenario`: a name or path of a scenario with `pd_clusters` (the workers load it by
    this reference); `keys`: tenant keys (default: random per run); `budgets_gbps`: egress
    budgets (scenario Gbps) set on those PD clusters before planning, as the scenario's own
    `egress_budget_gbps` would be (the plan, the simulator and the gateway all take them)."""
    s = load_scenario(scenario)
    if budgets_gbps:
        s = with_budgets(s, budgets_gbps)
    sc = scales or Scales()
    scaled = scale_scenario(s, sc)
    plan = plan_regions(s, "exact")["prfaas_pd"]
    sim_cfg = build_regions(s, plan, share_policy, controller=False)
    rate = sc.bytes / sc.time
    model = {"backend": "emulated", "scenario": str(s.path or scenario), "system": "prfaas_pd",
             "scales": sc.to_json()}
    engine = EmulatedEngineBackend.name
    timeouts = Timeouts(connect_s=10.0, prefill_s=REQUEST_TIMEOUT_S, kv_s=600.0,
                        token_s=120.0)
    regions: list[RegionSpec] = []
    tenants: list[TenantSpec] = []
    for setup, r in zip(sim_cfg.regions, s.pd_clusters, strict=True):
        p = plan.pd_clusters[r.name]
        bs_max = r.pool.hardware.require_decode().bs_max
        workers = (WorkerSpec(GATEWAY, "prfaas", engine=engine),
                   *(WorkerSpec(f"{r.name}-pdp-{i}", "pd-p", engine=engine)
                     for i in range(p.n_p or 0)),
                   *(WorkerSpec(f"{r.name}-pdd-{i}", "pd-d", max_batch=bs_max, engine=engine)
                     for i in range(p.n_d)))
        t_live = scaled.live_threshold(setup.threshold_tokens)
        link_live = setup.link_gbps * rate
        topo = Topology(
            name=f"{s.name}/{r.name} (emulated)", workers=workers, model=model,
            policy="prfaas-threshold", policy_args={"threshold_tokens": t_live},
            link=LinkSpec(link_live, CONNECTIONS), intra_link=LinkSpec(None, 2),
            cache_capacity_bytes=0, timeouts=timeouts, router_port=0,
            admission=AdmissionSpec(max_inflight=1024, max_queued_per_prefill=64))
        key = (keys or {}).get(r.name) or os.urandom(16).hex()
        regions.append(RegionSpec(r.name, topo, link_live, key))
        tenants.append(TenantSpec(r.name, f"PRFAAS_TENANT_KEY_{len(tenants)}",
                                  max(setup.share_weight, 1e-6), setup.budget_gbps * rate))
    prfaas_hw = scaled.scenario.prfaas.hardware.require_prefill()
    gateway = GatewayConfig(tuple(tenants), (), prfaas_hw, scaled.scenario.kv, share_policy,
                            QUANTUM_TOKENS / sc.tokens, request_timeout_s=REQUEST_TIMEOUT_S)
    prfaas_workers = tuple(WorkerSpec(f"prfaas-{i}", "prfaas", engine=engine)
                           for i in range(s.prfaas.instances))
    decoders = tuple(w for r in regions for w in r.topology.by_role("pd-d"))
    prfaas_topo = Topology(name=f"{s.name} (emulated)", workers=prfaas_workers + decoders,
                           model=model, link=LinkSpec(max(r.rate_gbps for r in regions),
                                                      CONNECTIONS),
                           cache_capacity_bytes=0, timeouts=timeouts, router_port=0)
    return RegionsSetup(s, str(s.path or scenario), scaled, plan, share_policy,
                        prfaas_workers, prfaas_topo, gateway, tuple(regions))


@dataclass
class RegionRun:
    """One region's requests in one live run (live seconds from the run's start)."""

    arrival_s: np.ndarray
    ready_s: np.ndarray  # KV at the decoder (nan: failed or unstamped)
    client_ready_s: np.ndarray
    finish_s: np.ndarray
    remote: np.ndarray  # bool: prefilled on the PrfaaS cluster
    ok: np.ndarray
    status: np.ndarray
    errors: tuple[str, ...]
    offered: np.ndarray | None = None  # bool: first routed to the PrfaaS cluster (live)
    retried: np.ndarray | None = None  # bool: retried or resumed after a failed attempt


def _record(results: list[Result]) -> RegionRun:
    nan = float("nan")

    def ready(r: Result) -> float:
        stamp = r.prfaas.get("kv_ready_unix_s")
        return r.sent_s + (float(stamp) - r.sent_unix_s) if r.ok and isinstance(
            stamp, (int, float)) else nan

    return RegionRun(
        np.array([r.sent_s for r in results]), np.array([ready(r) for r in results]),
        np.array([r.sent_s + r.ttft_s if r.ok and r.ttft_s is not None else nan
                  for r in results]),
        np.array([r.sent_s + r.e2e_s if r.ok and r.e2e_s is not None else nan
                  for r in results]),
        np.array([r.prfaas.get("route") == "prfaas" for r in results], dtype=bool),
        np.array([r.ok for r in results], dtype=bool),
        np.array([r.status for r in results]),
        tuple(sorted({r.error[:160] for r in results if not r.ok})[:3]),
        np.array([r.first_route == "prfaas" for r in results], dtype=bool),
        np.array([bool(r.prfaas.get("retried") or r.prfaas.get("resumed"))
                  for r in results], dtype=bool))


Fault = tuple[float, Callable[[], None]]  # (live seconds after the start, action)


def run_live(setup: RegionsSetup, dep: RegionsDeployment, workloads: Mapping[str, Workload],
             seed: int, faults: Sequence[Fault] = ()) -> dict[str, RegionRun]:
    """Every region's workload through its own router at once; `faults` run in threads at
    their times. Returns each region's requests."""
    names = list(workloads)

    async def main() -> list[list[Result]]:
        t0 = time.perf_counter()

        async def fault(at_s: float, action: Callable[[], None]) -> None:
            await asyncio.sleep(max(at_s - (time.perf_counter() - t0), 0.0))
            await asyncio.to_thread(action)

        loads = [run_load(dep.url(n), setup.model_name, prompts(workloads[n], seed + i),
                          [float(a) for a in workloads[n].arrival_s], CLIENT_TIMEOUT_S)
                 for i, n in enumerate(names)]
        done = await asyncio.gather(*loads, *(fault(t, f) for t, f in faults))
        return [d for d in done[:len(names)] if d is not None]

    results = asyncio.run(main())
    return {n: _record(r) for n, r in zip(names, results, strict=True)}


def _pct(values: np.ndarray, q: float) -> float | None:
    ok = values[np.isfinite(values)]
    return round(float(np.percentile(ok, q)), 4) if ok.size else None


def window_stats(run: RegionRun, lo_s: float, hi_s: float, a: float) -> dict[str, Any]:
    """Requests arriving in [lo, hi) live seconds: TTFT (KV at the decoder) in scenario s."""
    sel = (run.arrival_s >= lo_s) & (run.arrival_s < hi_s)
    ttft = (run.ready_s[sel] - run.arrival_s[sel]) / a
    return {"arrivals": int(sel.sum()), "completed": int(run.ok[sel].sum()),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90),
            "ttft_mean_s": round(float(np.nanmean(ttft)), 4) if np.isfinite(ttft).any()
            else None,
            "remote_share": round(float(run.remote[sel].mean()), 4) if sel.any() else None}


def run_stats(run: RegionRun, a: float) -> dict[str, Any]:
    """Whole-run figures as the simulator's (sim/regions_run.py): throughput = completions in
    the steady window [first + span / 4, last arrival] over its width, TTFT = arrival to KV at
    the decoder; scenario units."""
    first, last = float(run.arrival_s.min()), float(run.arrival_s.max())
    start = first + (last - first) / 4
    done = run.finish_s[np.isfinite(run.finish_s)]
    width = last - start
    thr = float(((done >= start) & (done <= last)).sum()) / width if width > 0 else 0.0
    ttft = (run.ready_s - run.arrival_s) / a
    return {"requests": int(run.arrival_s.size), "completed": int(run.ok.sum()),
            "shed": int(np.isin(run.status, (429, 503)).sum()),
            "throughput_rps": round(thr * a, 5),
            "offered_rps": round((run.arrival_s.size - 1) / max(last - first, 1e-9) * a, 5),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90),
            "offload_fraction": round(float(run.remote.mean()), 4),
            "errors": list(run.errors)}


def simulated(setup: RegionsSetup, workloads: Mapping[str, Workload]) -> dict[str, Any]:
    """The same requests (scenario units) through the multi-cluster simulator, with the live
    system's gateway policy and no threshold controller (the live routers keep t)."""
    cfg = build_regions(setup.scenario, setup.plan, setup.share_policy, controller=False)
    return simulate_regions(cfg, {k: setup.to_scenario_units(w) for k, w in workloads.items()})


def gateway_status(dep: RegionsDeployment, region: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{dep.gateway_url(region)}/status", timeout=5) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def partition_run(setup: RegionsSetup, dep: RegionsDeployment, *, cut: str, load: float,
                  warmup_s: float, window_s: float, seed: int = 0) -> dict[str, Any]:
    """Every region at `load` x its planned rate; region `cut`'s link down for `window_s`
    scenario seconds from `warmup_s + window_s` on. Per region: the `before` window (the
    `window_s` before the cut) and `during` (the cut), by arrival time, scenario units."""
    a = setup.a
    rates = {k: v * load for k, v in setup.planned_rps().items()}
    duration = warmup_s + 2 * window_s + window_s / 2
    work = setup.workloads(rates, duration, seed)
    t_cut = (warmup_s + window_s) * a
    t_heal = t_cut + window_s * a
    marks: dict[str, float] = {}
    snaps: dict[str, Any] = {}
    other = next(n for n in work if n != cut)  # the gateway as a region not cut reaches it
    t0 = time.monotonic()

    def down() -> None:
        marks["down_s"] = time.monotonic() - t0
        dep.partition(cut, True)
        snaps["at_cut"] = gateway_status(dep, other)  # what the cut caught in flight

    def up() -> None:
        dep.partition(cut, False)
        marks["up_s"] = time.monotonic() - t0

    runs = run_live(setup, dep, work, seed, [(t_cut, down), (t_heal, up)])
    out: dict[str, Any] = {"cut": cut, "load": load, "window_s": window_s,
                           "warmup_s": warmup_s, "rates_rps": rates,
                           "cut_at_live_s": [round(marks.get("down_s", float("nan")), 3),
                                             round(marks.get("up_s", float("nan")), 3)],
                           "in_flight_at_cut": in_flight_at_cut(
                               runs[cut], marks.get("down_s", t_cut), snaps.get("at_cut"),
                               cut),
                           "regions": {}}
    for name, run in runs.items():
        before = window_stats(run, t_cut - window_s * a, t_cut, a)
        during = window_stats(run, t_cut, t_heal, a)
        out["regions"][name] = {"before": before, "during": during, "run": run_stats(run, a)}
    # the simulator on the same requests without the cut: what the live run is set beside,
    # and the same two windows of it (how much they differ with no fault at all)
    out["sim_no_cut"] = simulated(setup, work)["pd_clusters"]
    sim = RegionsSimulator(build_regions(setup.scenario, setup.plan, setup.share_policy,
                                         controller=False),
                           {k: setup.to_scenario_units(w) for k, w in work.items()}).run()
    out["sim_no_cut_windows"] = {}
    for reg in sim.regions:
        arr = reg.work.arrival_s * a  # (live seconds, as the windows)
        srun = RegionRun(arr, reg.kv_at * a, reg.kv_at * a, reg.finish * a, reg.offloaded,
                         np.isfinite(reg.finish), np.zeros(arr.size), ())
        b = window_stats(srun, t_cut - window_s * a, t_cut, a)
        d = window_stats(srun, t_cut, t_heal, a)
        out["sim_no_cut_windows"][reg.setup.name] = {
            "before": b, "during": d,
            "ttft_ratio": {k: round(d[k] / b[k], 4) if b[k] and d[k] is not None else None
                           for k in ("ttft_p50_s", "ttft_p90_s", "ttft_mean_s")}}
    for name, reg in out["regions"].items():
        if name == cut:
            continue
        b, d = reg["before"], reg["during"]
        reg["ttft_ratio"] = {k: round(d[k] / b[k], 4) if b[k] and d[k] is not None else None
                             for k in ("ttft_p50_s", "ttft_p90_s", "ttft_mean_s")}
        reg["within_10pct"] = all(v is not None and v <= 1.10
                                  for v in reg["ttft_ratio"].values())
    return out


def in_flight_at_cut(run: RegionRun, t_cut_s: float, gateway: dict[str, Any] | None,
                     cut: str) -> dict[str, Any]:
    """What the cut of region `cut`'s link caught: the gateway's prefills of that destination
    computing (`running`: their KV streams as it is made) and past their compute with the KV
    tail crossing (`transferring`) at the cut; and, from the region's own requests, those
    first sent to the PrfaaS cluster before the cut whose KV had not reached a decoder by then
    (`client_in_flight`), and how they ended: retried or resumed locally and completed, or
    failed. Live seconds on the run's timeline (the cut's mark is the moment it was made)."""
    offered = run.offered if run.offered is not None else run.remote
    retried = run.retried if run.retried is not None else np.zeros(run.ok.size, dtype=bool)
    caught = (offered & (run.arrival_s < t_cut_s)
              & ~(np.isfinite(run.ready_s) & (run.ready_s <= t_cut_s)))
    tenant = (gateway or {}).get("tenants", {}).get(cut, {})
    return {"gateway_running": tenant.get("running"),
            "gateway_transferring": tenant.get("transferring"),
            "gateway_failed_before_cut": tenant.get("failed"),
            "client_in_flight": int(caught.sum()),
            "completed": int((caught & run.ok).sum()),
            "completed_after_retry": int((caught & run.ok & retried).sum()),
            "completed_remote": int((caught & run.ok & run.remote).sum()),
            "failed": int((caught & ~run.ok).sum())}


def fairness_runs(setup: RegionsSetup, dep: RegionsDeployment, *, hog: str, load: float,
                  overload: float, duration_s: float, seed: int = 0) -> dict[str, Any]:
    """The fair run (every region at `load` x plan) and the overloaded one (`hog` at
    `overload` x its plan), live and simulated on the same requests; per victim its
    throughput and P90 TTFT relative to the fair run (the simulator's fairness_runs)."""
    base = setup.planned_rps()
    out: dict[str, Any] = {"hog": hog, "load": load, "overload": overload,
                           "duration_s": duration_s, "share_policy": setup.share_policy}
    runs = {}
    for label, rates in (("fair", {k: v * load for k, v in base.items()}),
                         ("overloaded", {k: v * (overload if k == hog else load)
                                         for k, v in base.items()})):
        work = setup.workloads(rates, duration_s, seed)
        live = run_live(setup, dep, work, seed)
        runs[label] = {"live": {k: run_stats(r, setup.a) for k, r in live.items()},
                       "sim": simulated(setup, work)["pd_clusters"],
                       "gateway": gateway_status(dep, next(iter(base)))}
    out["runs"] = runs
    out["victims"] = {}
    for k in base:
        if k == hog:
            continue
        out["victims"][k] = {side: fairness_relative(runs["overloaded"][side][k],
                                                     runs["fair"][side][k])
                             for side in ("live", "sim")}
    return out


def with_policy(setup: RegionsSetup, share_policy: str) -> RegionsSetup:
    return replace(setup, share_policy=share_policy,
                   gateway=replace(setup.gateway, share_policy=share_policy))



# `prfaas reproduce --live --quick` on a multi-cluster scenario deploys its half-size twin when
# it has one: the live scale of this one host (the scenario file says so)
QUICK_TWIN = {"two-regions": "two-regions-live"}
REPRODUCE_SCALES = Scales(time=0.5, bytes=2e-3, tokens=8, output=64)


def reproduce_regions_live(scenario: str, out_dir: Path, quick: bool,
                           scales: Scales | None = None, load: float = 0.8,
                           tick: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every region at `load` x its planned rate (120 scenario s; 240 without --quick), live
    and simulated on the same requests: per region throughput, TTFT P50 / P90 and offload,
    the gateway's per-tenant figures; live.json and regions_live_vs_sim.png in `out_dir`."""
    deployed_name = QUICK_TWIN.get(scenario, scenario) if quick else scenario
    setup = regions_setup(deployed_name, scales or REPRODUCE_SCALES)
    duration = 120.0 if quick else 240.0
    rates = {k: v * load for k, v in setup.planned_rps().items()}
    work = setup.workloads(rates, duration, seed=0)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with setup.deployment() as dep:
        tick("deployment up")
        live = run_live(setup, dep, work, 0)
        tick("live run done")
        gateway = gateway_status(dep, next(iter(rates)))
    sim = simulated(setup, work)["pd_clusters"]
    result = {
        "scenario": scenario, "deployed": deployed_name, "backend": "emulated",
        "link_emulation": "netns: one tc-tbf veth per region (rate only; RTT/loss not "
                          "emulated)",
        "scales": setup.scaled.scales.to_json(), "load": load, "duration_s": duration,
        "planned_rps": {k: round(v, 4) for k, v in setup.planned_rps().items()},
        "plan": setup.plan.to_json(), "share_policy": setup.share_policy,
        "regions": {k: {"live": run_stats(r, setup.a), "sim": sim[k]} for k, r in live.items()},
        "gateway": gateway, "wall_s": round(time.time() - t0, 1),
        "loadavg_1m_end": os.getloadavg()[0],
        "units": "rates in scenario req/s, times in scenario s (live / scales.time)"}
    (out_dir / "live.json").write_text(json.dumps(result, indent=1) + "\n")
    result["plot"] = str(regions_plot(result, out_dir / "regions_live_vs_sim.png"))
    return result


def regions_plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["regions"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    x = np.arange(len(names))
    for ax, key, label in ((axes[0], "throughput_rps", "throughput (scenario req/s)"),
                           (axes[1], "ttft_p90_s", "TTFT P90 (scenario s)")):
        for j, side in enumerate(("live", "sim")):
            vals = [result["regions"][n][side][key] or 0.0 for n in names]
            ax.bar(x + (j - 0.5) * 0.38, vals, 0.38,
                   label="live (emulated)" if side == "live" else "simulator, same requests")
        ax.set_xticks(x, names)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{result['deployed']}: each region at {result['load']:.0%} of its plan, "
                 f"live vs simulated", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
