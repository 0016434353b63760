"""The simulator's side of `prfaas reproduce --live` alone: each system's capacity by the
live search's procedure (probe.Search from the fixed start, on the live probe workloads) and by
the simulator's 4000-request search, for a scenario and scales. No processes start; it shows
what the simulator answers before any live run and how far short probes sit from long ones.

    python benchmarks/bench_live_sim_search.py --scenario paper-case-study --scales time=0.2 \
        --out benchmarks/results/live/sim-search-paper-case-study.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prfaas.emulated.cli import parse_scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.live import FULL, QUICK, SYSTEMS, SystemRun
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="paper-case-study")
    ap.add_argument("--scales", default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    s, sc = load_scenario(args.scenario), parse_scales(args.scales)
    options = FULL if args.full else QUICK
    plans = plan_all(s, mode="exact")
    systems = {}
    for name in SYSTEMS:
        sr = SystemRun(emulated_system(s, name, sc), options, lambda _: None, None)
        search, bracket, standard = sr.sim_capacity(plans.systems[name].lambda_max / sc.time)
        a = sc.time
        systems[name] = {
            "sim_capacity_rps": round((bracket.sustained_rps or 0.0) * a, 4),
            "sim_bracket_rps": [None if v is None else round(v * a, 5)
                                for v in (bracket.sustained_rps, bracket.unsustained_rps)],
            "sim_converged": bracket.converged,
            "sim_probes": [{"rate_rps": round(p.rate_rps * a, 5), "sustained": p.sustainable,
                            "requests": p.requests} for p in search.probes],
            "sim_capacity_4000_rps": round(standard * a, 4),
            "planner_exact_rps": round(plans.systems[name].lambda_max, 4)}
    out = {"scenario": s.name, "scales": sc.to_json(), "options": options.to_json(),
           "systems": systems, "units": "scenario req/s"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, v in systems.items():
        print(f"{name}: {v['sim_bracket_rps']} ({len(v['sim_probes'])} probes), "
              f"4000-request {v['sim_capacity_4000_rps']}")


if __name__ == "__main__":
    main()
