"""The simulator's side of `prfaas reproduce --live` alone: each system's capacity by the live
search's procedure (probe.Search from the fixed start on the live probe workloads, then
probe.Confirm's long probes at the bracket) and by the simulator's 4000-request search, for a
scenario, scales and seeds. No processes start; it shows what the simulator answers before any
live run, how far short probes sit from long ones, and each bracket end's margin in requests.

    python benchmarks/bench_live_sim_search.py --scenario paper-case-study --scales time=0.2 \
        --seeds 0 1 2 --out benchmarks/results/live/sim-search-paper-case-study.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.emulated.cli import parse_scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.live import FULL, QUICK, SYSTEMS, Seeds, SystemRun
from prfaas.experiments.probe import Bracket, ProbeResult
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario


def _bracket(b: Bracket, a: float) -> list[float | None]:
    return [None if v is None else round(v * a, 5) for v in (b.sustained_rps, b.unsustained_rps)]


def _probes(probes: list[ProbeResult], a: float) -> list[dict[str, Any]]:
    return [{"rate_rps": round(p.rate_rps * a, 5), "sustained": p.sustainable,
             "requests": p.requests, "margin_requests": p.margin_requests} for p in probes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="paper-case-study")
    ap.add_argument("--scales", default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    s, sc = load_scenario(args.scenario), parse_scales(args.scales)
    options = FULL if args.full else QUICK
    plans = plan_all(s, mode="exact")
    a = sc.time
    systems: dict[str, Any] = {}
    for name in SYSTEMS:
        per_seed = {}
        for seed in args.seeds:
            sr = SystemRun(emulated_system(s, name, sc), options, lambda _: None, None, seed)
            sim = sr.sim_capacity(plans.systems[name].lambda_max / a)
            per_seed[str(seed)] = {
                "seeds": vars(Seeds.of(seed)),
                "sim_capacity_rps": round((sim.bracket.sustained_rps or 0.0) * a, 4),
                "sim_bracket_rps": _bracket(sim.bracket, a),
                "sim_short_bracket_rps": _bracket(sim.short, a),
                "sim_converged": sim.bracket.converged,
                "sim_probes": _probes(sim.search.probes, a),
                "sim_confirm_probes": _probes(sim.confirm.probes, a)}
            # the first seed's short search at the top, as this file always held
            systems.setdefault(name, {
                "sim_capacity_rps": round((sim.short.sustained_rps or 0.0) * a, 4),
                "sim_bracket_rps": _bracket(sim.short, a),
                "sim_converged": sim.short.converged,
                "sim_probes": _probes(sim.search.probes, a),
                "sim_capacity_4000_rps": round(sim.standard_rps * a, 4),
                "planner_exact_rps": round(plans.systems[name].lambda_max, 4)})
        systems[name]["seeds"] = per_seed
    out = {"scenario": s.name, "scales": sc.to_json(), "options": options.to_json(),
           "systems": systems, "units": "scenario req/s"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, v in systems.items():
        for seed, r in v["seeds"].items():
            edges = [p["margin_requests"] for p in r["sim_confirm_probes"]]
            print(f"{name} seed {seed}: short {r['sim_short_bracket_rps']} -> long "
                  f"{r['sim_bracket_rps']} (long-probe margins {edges}); 4000-request "
                  f"{v['sim_capacity_4000_rps']}")


if __name__ == "__main__":
    main()
