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
STEPS = 3 + 3 * len(SYSTEMS) + 1  # plans(2) + capacities + two TTFT runs each + plots (+1)


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
    paths = [
        plots.ttft_cdf(ttft_common, f"TTFT at {common_rps} req/s (uniform arrivals)",
                       out_dir / "ttft_cdf.png"),
        plots.throughput_vs_offered(capacity, out_dir / "throughput_vs_offered.png"),
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
        "runs": runs, "plots": [p.name for p in paths], "reference": s.reference,
    }
