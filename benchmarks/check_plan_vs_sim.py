"""The planner's exact plan against the simulator's capacity on random feasible scenarios.

For each seed: a random scenario (catalog model or linear KV fit, quadratic prefill profiles,
decode profile, instance counts, link rate, log-normal lengths, output length), its PrfaaS-PD
plan in `exact` mode, then the simulator's capacity search on that plan's configuration with
uniform arrivals, as `prfaas capacity` runs it (first probe at the paper-mode estimate, the
same seed at every rate). Writes benchmarks/results/plan_vs_sim.json with each figure; the
issue's bound is |sim / plan - 1| <= 3%, reported per scenario, never widened.

    PYTHONPATH=src python benchmarks/check_plan_vs_sim.py [--scenarios 10] [--requests 4000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.models.catalog import catalog
from prfaas.planner.search import plan_all
from prfaas.scenario import parse_scenario
from prfaas.sim.capacity import find_capacity
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals

OUT = Path(__file__).parent / "results" / "plan_vs_sim.json"
BOUND = 0.03


def random_scenario(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    models = sorted(n for n, s in catalog().items() if s.params_active_b is not None)
    base_s = float(rng.uniform(0.05, 0.5))
    per_token_s = float(rng.uniform(2e-5, 2e-4))
    quad = float(rng.uniform(0.0, 3e-9))
    points = [{"length_tokens": n, "time_s": base_s + per_token_s * n + quad * n * n}
              for n in (1024, 8192, 32768)]
    lo = int(rng.integers(32, 1024))
    hi = int(rng.integers(4 * lo, 65536))
    raw: dict[str, Any] = {
        "name": f"random-{seed}",
        "hardware": {
            "fast": {"gpus_per_instance": 8, "prefill": {"fit": "quadratic", "points": points}},
            "slow": {"gpus_per_instance": 8,
                     "prefill": {"scale_of": "fast", "factor": float(rng.uniform(1.5, 5.0))},
                     "decode": {"bs_max": int(rng.integers(8, 64)),
                                "step_s": float(rng.uniform(0.01, 0.05))}},
        },
        "clusters": {"prfaas": {"hardware": "fast", "instances": int(rng.integers(1, 5))},
                     "pd": {"hardware": "slow", "instances": int(rng.integers(2, 9))}},
        "link": {"gbps": float(rng.choice([5.0, 10.0, 25.0, 100.0]))},
        "workload": {"input": {"dist": "lognormal",
                               "mu": round(float(rng.uniform(np.log(lo), np.log(hi))), 3),
                               "sigma": round(float(rng.uniform(0.4, 1.4)), 3),
                               "min_tokens": lo, "max_tokens": hi},
                     "output_tokens": int(rng.integers(64, 1025))},
        "planner": {"t_step_tokens": 100, "mode": "exact"},
    }
    if rng.random() < 0.5:
        raw["model"] = str(rng.choice(models))
        raw["kv"] = {"from": "model"}
    else:
        raw["kv"] = {"fit": "linear", "points": [
            {"length_tokens": 1000, "bytes": float(rng.uniform(1e7, 2e8))},
            {"length_tokens": 100000, "bytes": float(rng.uniform(3e8, 5e9))}]}
    return raw


def measure(seed: int, requests: int) -> dict[str, Any]:
    raw = random_scenario(seed)
    s = parse_scenario(raw)
    exact = plan_all(s, mode="exact")
    paper = plan_all(s, mode="paper").systems["prfaas_pd"].lambda_max
    plan = exact.systems["prfaas_pd"]
    try:
        cfg = build_system(s, "prfaas_pd", planned=exact)
    except ConfigError as err:  # e.g. a plan with N_p = 0, which the simulator does not build
        return {"seed": seed, "scenario": raw, "plan_exact_rps": plan.lambda_max,
                "n_p": plan.n_p, "n_d": plan.n_d, "not_simulated": str(err)}
    start = time.perf_counter()
    cap = find_capacity(cfg, s.lengths, s.output_tokens, make_arrivals("uniform"),
                        requests=requests, seed=0, guess_rps=paper)
    ratio = cap.max_rps / plan.lambda_max
    return {"seed": seed, "scenario": raw, "plan_exact_rps": plan.lambda_max,
            "plan_paper_rps": paper, "threshold_tokens": plan.threshold_tokens,
            "n_prfaas": plan.n_prfaas, "n_p": plan.n_p, "n_d": plan.n_d,
            "bottleneck": plan.bottleneck, "prfaas_limited_by": plan.extra["prfaas_limited_by"],
            "offload_fraction": plan.offload_fraction, "sim_capacity_rps": cap.max_rps,
            "sim_over_plan": ratio, "within_3pct": abs(ratio - 1) <= BOUND,
            "probes": len(cap.probes), "search_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenarios", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    seed = args.first_seed
    while sum("sim_capacity_rps" in r for r in rows) < args.scenarios:
        row = measure(seed, args.requests)
        rows.append(row)
        seed += 1
        if "not_simulated" in row:
            print(f"seed {row['seed']}: not simulated: {row['not_simulated']}", flush=True)
            continue
        print(f"seed {row['seed']}: plan {row['plan_exact_rps']:.4f}"
              f" sim {row['sim_capacity_rps']:.4f} ratio {row['sim_over_plan']:.4f}"
              f" bottleneck {row['bottleneck']}"
              f" ({row['prfaas_limited_by']}) {row['search_s']} s", flush=True)
    out = {"bound": BOUND, "arrivals": "uniform", "requests": args.requests,
           "within": sum(r.get("within_3pct", False) for r in rows),
           "scenarios": sum("sim_capacity_rps" in r for r in rows), "rows": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
