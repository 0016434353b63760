"""The case study end to end: planner, simulated capacities, TTFT under load, plots.

Steps (each a tick of the caller's progress callback):
1. plan_all in the paper's mode and in exact mode;
2. capacity search (uniform arrivals, stratified lengths, 4000 requests a probe) per system;
3. TTFT at one common offered load (90% of the smallest capacity) and at 90% of each system's
   own capacity (uniform arrivals, 4000 requests, seed 0);
4. PNG plots and results.json in the output folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.planner.search import PlanResult, plan_all
from prfaas.scenario import Scenario
from prfaas.sim import plots
from prfaas.sim.capacity import CapacityResult, find_capacity
from prfaas.sim.metrics import egress_windows
from prfaas.sim.run import simulate
from prfaas.sim.system import SYSTEMS, build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic

LOAD_SHARE = 0.9
REQUESTS = 4000
SWEEP_SHARES = (0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25)  # x the largest capacity
SWEEP_REQUESTS = 1500
STEPS = 3 + 4 * len(SYSTEMS) + 1  # plans(2) + capacities + two TTFT runs + sweep each + plots


def reproduce(s: Scenario, out_dir: Path, tick: Callable[[str], None] = lambda _: None
              ) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    plans: dict[str, PlanResult] = {}
    for mode in ("paper", "exact"):
        plans[mode] = plan_all(s, mode=mode)
        tick(f"planned ({mode})")
    uniform = make_arrivals("uniform")
    configs = {name: build_system(s, name) for name in SYSTEMS}
    capacity: dict[str, CapacityResult] = {}
    for name in SYSTEMS:
        capacity[name] = find_capacity(configs[name], s.lengths, s.output_tokens, uniform,
                                       requests=REQUESTS, seed=0,
                                       guess_rps=plans["paper"].systems[name].lambda_max)
        tick(f"capacity of {name}")
    common_rps = round(LOAD_SHARE * min(c.max_rps for c in capacity.values()), 3)
    runs: dict[str, dict[str, Any]] = {}
    ttft_common: dict[str, np.ndarray] = {}
    egress = np.zeros(0)
    for name in SYSTEMS:
        own_rps = round(LOAD_SHARE * capacity[name].max_rps, 3)
        entry: dict[str, Any] = {}
        for label, rate in (("common", common_rps), ("own90", own_rps)):
            workload = synthetic(s.lengths, s.output_tokens, uniform, rate, REQUESTS, seed=0)
            sim, summary = simulate(configs[name], workload)
            summary.pop("sim_wall_s")
            entry[label] = summary
            if label == "common":
                ttft_common[name] = np.asarray(sim.log.kv_ready_s) - workload.arrival_s
            elif name == "prfaas_pd":
                egress = egress_windows(sim)
            tick(f"TTFT of {name} at {rate} req/s")
        runs[name] = entry
    sweep = _load_sweep(s, configs, max(c.max_rps for c in capacity.values()), tick)
    paths = [
        plots.ttft_cdf(ttft_common, f"TTFT at {common_rps} req/s (uniform arrivals)",
                       out_dir / "ttft_cdf.png"),
        plots.load_sweep(sweep, capacity, out_dir / "throughput_vs_offered.png"),
        plots.egress_over_time(egress, configs["prfaas_pd"].link.gbps[0],
                               "PrfaaS-PD egress at 90% of its capacity",
                               out_dir / "egress_over_time.png"),
    ]
    tick("plots")
    return {
        "scenario": s.name, "common_rps": common_rps, "load_share": LOAD_SHARE,
        "requests_per_run": REQUESTS,
        "planner": {mode: {n: p.systems[n].to_json() for n in SYSTEMS}
                    for mode, p in plans.items()},
        "capacity": {n: c.to_json() for n, c in capacity.items()},
        "runs": runs, "load_sweep": sweep, "plots": [p.name for p in paths],
        "reference": s.reference,
    }


def _load_sweep(s: Scenario, configs: dict[str, Any], top_rps: float,
                tick: Callable[[str], None]) -> dict[str, list[dict[str, float]]]:
    """Every system on one grid of offered loads (shares of the largest capacity)."""
    uniform = make_arrivals("uniform")
    sweep: dict[str, list[dict[str, float]]] = {}
    for name in SYSTEMS:
        rows = []
        for share in SWEEP_SHARES:
            rate = round(share * top_rps, 3)
            workload = synthetic(s.lengths, s.output_tokens, uniform, rate, SWEEP_REQUESTS, seed=0)
            _, summary = simulate(configs[name], workload)
            rows.append({"offered_rps": rate, "throughput_rps": summary["throughput_rps"],
                         "ttft_p90_s": summary["ttft_s"]["p90"]})
        sweep[name] = rows
        tick(f"load sweep of {name}")
    return sweep
