"""Capacity of a multi-cluster deployment along its plan's mix, searched live and in the
simulator the same way (issue 22, with the trust issue's search: experiments/probe.py).

Every region offers x times its planned rate; x is what is searched. A probe at x is
`probe_s` scenario seconds of uniform arrivals per region (`RegionsSetup.workloads`, one seed:
the same requests for the same x on both sides). Verdict per region: `probe.judge`, the trust
issue's short-probe form of sim/regions_run.py's rule (ready events, the KV at the decoder, in
place of completions; a 2-request floor on the throughput deficit; every request completed),
computed by one function from per-request arrival, ready and finish times, on the live request
log and on the simulator's run of the same requests; x is sustained when every region's verdict
is. sim/regions_run.py's own rule (`region_verdict`, completions) is computed per probe too and
reported, not searched on: on probes this short it is biased (a request's end-to-end time is
not short beside the warm-up quarter, so the window misses completions; at 120 s probes it
calls a quarter of the plan unsustained). Both searches are `probe.Search` from `start_scale`,
a fixed scale that depends on no estimate: double while sustained, halve while not, then
bisect. Capacity = the highest sustained x; per region x* times its planned rate. Every live
probe is also simulated on its own requests, so each live verdict sits beside the simulator's
on the same requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from prfaas.experiments.probe import Bracket, ProbeResult, Search, judge
from prfaas.experiments.regions_live import RegionRun, RegionsSetup, run_live
from prfaas.serve.deploy.regions import RegionsDeployment
from prfaas.sim.regions import RegionsSimulator
from prfaas.sim.regions_run import THROUGHPUT_SHARE, build_regions
from prfaas.workload.requests import Workload

GROWTH_MIN = 10.0  # sim/regions_run.py's allowance: max(10, 10% of the mean in system)
GROWTH_SHARE = 0.1


@dataclass(frozen=True)
class CapacityOptions:
    start_scale: float = 0.25  # fixed: a quarter of the plan, never a simulated answer
    # scenario s per probe (~220 near and ~86 far requests at the plan's rates): 7 probes,
    # each one live minute plus its drain, fit the host's ~15 min budget for one search
    probe_s: float = 140.0
    rel_tol: float = 0.02
    max_probes: int = 7
    seed: int = 0


@dataclass(frozen=True)
class RegionVerdict:
    offered_rps: float
    throughput_rps: float
    queue_growth: float
    in_system_mean: float
    requests: int
    completed: int
    sustainable: bool


def region_verdict(offered_rps: float, arrival_s: np.ndarray, finish_s: np.ndarray
                   ) -> RegionVerdict:
    """sim/regions_run.py's rule on one region's requests (scenario units; finish nan: never
    finished, in the system to the end). In system = arrived, not finished, as the simulator's
    `in_system_seen`."""
    order = np.argsort(arrival_s, kind="stable")
    arr, fin = arrival_s[order], np.where(np.isfinite(finish_s), finish_s, np.inf)[order]
    n = arr.size
    first, last = float(arr[0]), float(arr[-1])
    start = first + (last - first) / 4
    done = fin[np.isfinite(fin)]
    width = last - start
    throughput = float(((done >= start) & (done <= last)).sum()) / width if width > 0 else 0.0
    seen = np.array([np.sum(fin[:i] > arr[i]) for i in range(n)], dtype=float)
    q2, q4 = seen[n // 4: n // 2], seen[3 * n // 4:]
    growth = float(q4.mean() - q2.mean()) if q2.size and q4.size else 0.0
    mean = float(seen.mean())
    ok = throughput >= THROUGHPUT_SHARE * offered_rps and growth <= max(GROWTH_MIN,
                                                                         GROWTH_SHARE * mean)
    return RegionVerdict(round(offered_rps, 6), round(throughput, 6), round(growth, 3),
                         round(mean, 3), int(n), int(done.size), bool(ok))


@dataclass(frozen=True)
class Judged:
    """One region's requests in one run, judged: `probe.judge` (the search's verdict) and
    sim/regions_run.py's rule (reported)."""

    probe: ProbeResult
    regions_rule: RegionVerdict

    @property
    def sustainable(self) -> bool:
        return self.probe.sustainable

    def to_json(self) -> dict[str, Any]:
        p = self.probe
        return {"sustained": p.sustainable, "offered_rps": round(p.rate_rps, 5),
                "ready_throughput_rps": round(p.throughput_rps, 5),
                "queue_growth": round(p.queue_growth, 3), "completed": p.completed,
                "requests": p.requests, "ttft_s": p.ttft_s,
                "regions_rule": asdict(self.regions_rule)}


def judged(offered_rps: float, arrival_s: np.ndarray, ready_s: np.ndarray,
           finish_s: np.ndarray) -> Judged:
    """Scenario units, per request (nan: never ready / never finished)."""
    return Judged(judge(offered_rps, arrival_s, ready_s, finish_s),
                  region_verdict(offered_rps, arrival_s, finish_s))


@dataclass(frozen=True)
class MixProbe:
    """One probe at scale x: each region's verdict (the one the search reads) and, for a live
    probe, the simulator's on the same requests beside it."""

    scale: float
    regions: dict[str, Judged]
    sim: dict[str, Judged] | None = None

    @property
    def sustainable(self) -> bool:
        return all(v.sustainable for v in self.regions.values())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scale": round(self.scale, 6), "sustained": self.sustainable,
                               "regions": {k: v.to_json() for k, v in self.regions.items()}}
        if self.sim is not None:
            out["sim_sustained"] = all(v.sustainable for v in self.sim.values())
            out["sim_regions"] = {k: v.to_json() for k, v in self.sim.items()}
        return out


def probe_workloads(setup: RegionsSetup, scale: float, opts: CapacityOptions
                    ) -> dict[str, Workload]:
    rates = {k: v * scale for k, v in setup.planned_rps().items()}
    return setup.workloads(rates, opts.probe_s, opts.seed)


def sim_verdicts(setup: RegionsSetup, work: Mapping[str, Workload]) -> dict[str, Judged]:
    """The same requests through the simulator (the live system's gateway policy, controller
    off as the live routers), judged: ready = `kv_at`."""
    cfg = build_regions(setup.scenario, setup.plan, setup.share_policy, controller=False)
    sim = RegionsSimulator(cfg, {k: setup.to_scenario_units(w) for k, w in work.items()}).run()
    return {reg.setup.name: judged(reg.work.offered_rps(), reg.work.arrival_s, reg.kv_at,
                                   reg.finish) for reg in sim.regions}


def live_verdicts(setup: RegionsSetup, work: Mapping[str, Workload],
                  runs: Mapping[str, RegionRun]) -> dict[str, Judged]:
    """The live request log judged: send, ready (the decode worker's KV stamp, the
    simulator's `kv_at` event) and finish times / a (scenario s); the offered rate of the
    requests as generated (the simulator's)."""
    a = setup.a
    return {k: judged(setup.to_scenario_units(work[k]).offered_rps(), run.arrival_s / a,
                      run.ready_s / a, run.finish_s / a) for k, run in runs.items()}


def search(probe: Callable[[float], MixProbe], opts: CapacityOptions) -> Search[MixProbe]:
    return Search(probe, opts.start_scale, rel_tol=opts.rel_tol, max_probes=opts.max_probes)


def sim_search(setup: RegionsSetup, opts: CapacityOptions) -> tuple[Search[MixProbe], Bracket]:
    s = search(lambda x: MixProbe(x, sim_verdicts(setup, probe_workloads(setup, x, opts))),
               opts)
    return s, s.run()


def live_search(setup: RegionsSetup, dep: RegionsDeployment, opts: CapacityOptions,
                on_probe: Callable[[MixProbe], None] = lambda _: None
                ) -> tuple[Search[MixProbe], Bracket]:
    """The search on one deployment: each probe live, then simulated on its requests."""

    def probe(x: float) -> MixProbe:
        work = probe_workloads(setup, x, opts)
        runs = run_live(setup, dep, work, opts.seed)
        p = MixProbe(x, live_verdicts(setup, work, runs), sim_verdicts(setup, work))
        on_probe(p)
        return p

    s = search(probe, opts)
    return s, s.run()


def bracket_json(setup: RegionsSetup, s: Search[MixProbe], b: Bracket) -> dict[str, Any]:
    """The bracket as scales and rates (scenario req/s), per region: x* x its plan."""
    plan = setup.planned_rps()
    x = b.sustained_rps or 0.0
    per_region: dict[str, Any] = {}
    for k in plan:  # each region's own verdicts over the probes (which region binds)
        ok = [p.scale for p in s.probes if p.regions[k].sustainable]
        over = [p.scale for p in s.probes if not p.regions[k].sustainable]
        per_region[k] = {"capacity_rps": round(x * plan[k], 4),
                         "own_bracket_scale": [max(ok) if ok else None,
                                               min(over) if over else None]}
    return {"bracket_scale": [b.sustained_rps, b.unsustained_rps],
            "width": None if b.width is None else round(b.width, 4),
            "converged": b.converged, "capacity_scale": x,
            "capacity_rps": round(x * sum(plan.values()), 4), "regions": per_region,
            "probes": [p.to_json() for p in s.probes]}


METHOD = {
    "scale": "every region offers x times its planned rate (exact plan); x is searched",
    "probe": "probe_s scenario s of uniform arrivals per region, seed fixed: the same requests "
             "for the same x live and simulated",
    "search": "probe.Search from start_scale (fixed, no estimate): double while sustained, "
              "bisect until (unsustained - sustained) / sustained <= rel_tol or max_probes",
    "sustained": "every region: probe.judge (ready-event throughput in the steady window >= "
                 "98% of the offered rate or short by <= 2 requests, queue by ready events not "
                 "growing, every request completed), the same function on the live log and "
                 "the simulated run (controller off, as the live routers)",
    "regions_rule": "sim/regions_run.py's completion-based rule, reported per probe, not "
                    "searched on (biased on short probes)"}


def capacity_json(setup: RegionsSetup, opts: CapacityOptions,
                  live: tuple[Search[MixProbe], Bracket],
                  sim: tuple[Search[MixProbe], Bracket], sim_long: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The live and simulated searches side by side; `sim_long`: find_region_capacity's
    long-run result (its 4000-request probes and its own rule), a reference."""
    lv, sm = bracket_json(setup, *live), bracket_json(setup, *sim)
    x_live, x_sim = lv["capacity_scale"], sm["capacity_scale"]
    pairs = [(p.sustainable, all(v.sustainable for v in (p.sim or {}).values()))
             for p in live[0].probes]
    disagree = sum(v.sustainable != v.regions_rule.sustainable
                   for p in sim[0].probes for v in p.regions.values())
    return {
        "options": asdict(opts), "method": METHOD,
        "planned_rps": {k: round(v, 4) for k, v in setup.planned_rps().items()},
        "planned_total_rps": round(sum(setup.planned_rps().values()), 4),
        "live": lv, "sim": sm,
        "sim_long": {"scale": sim_long["scale"], "max_rps": sim_long["max_rps"],
                     "requests": sim_long["requests"], "probes": len(sim_long["probes"])},
        "live_over_sim": round(x_live / x_sim, 4) if x_sim else None,
        "live_over_plan": round(x_live, 4), "sim_over_plan": round(x_sim, 4),
        "live_probes_agreeing_with_sim": sum(a == b for a, b in pairs),
        "live_probes": len(pairs),
        "sim_regions_rule_disagreements": int(disagree),
        "sim_region_verdicts": sum(len(p.regions) for p in sim[0].probes)}
