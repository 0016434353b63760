"""Benchmark: the two-regions scenario (issue 22), planned and simulated; what docs/multi-region.md
cites. Writes benchmarks/results/two_regions.json and docs/img/two_regions.png.

The same steps as `prfaas reproduce --scenario two-regions` (plans under both objectives and
modes, simulated capacity beside the exact plan, the fairness runs with DRR and FCFS), plus the
capacity search repeated over seeds 0-2 at 4,000 and 16,000 requests per probe (how much the
figure moves with the seed and with the run length), and the same searches with K = 1 on the
case study (`k1_case_study`). Deterministic: no wall-clock figure but
`wall_s`. About 60 s on one core.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from importlib import resources
from pathlib import Path

import yaml

from prfaas.planner.regions_plan import plan_regions
from prfaas.scenario import Scenario, load_scenario, parse_scenario
from prfaas.sim.regions_report import reproduce_regions
from prfaas.sim.regions_run import build_regions, find_region_capacity

HERE = Path(__file__).parent
OUT = HERE / "results" / "two_regions.json"
IMG = HERE.parent / "docs" / "img" / "two_regions.png"


def one_region() -> Scenario:
    """paper-case-study written with one entry in pd_clusters (the K = 1 case)."""
    raw = yaml.safe_load(resources.files("prfaas.data").joinpath(
        "scenarios", "paper-case-study.yaml").read_text())
    raw["pd_clusters"] = [{"name": "only", "hardware": "h20", "instances": 8,
                           "link": {"gbps": 100}, "workload": {
                               "input": raw.pop("workload")["input"], "output_tokens": 1024}}]
    raw.pop("link")
    raw["clusters"].pop("pd")
    return parse_scenario(raw)


def k1_case_study() -> dict:
    """The multi-cluster loop on the one-cluster case study: its capacity beside the exact plan,
    threshold controller on and off (what the one-cluster simulator gets: docs/simulator.md)."""
    s = one_region()
    plan = plan_regions(s, "exact", "throughput")["prfaas_pd"]
    out: dict = {"planned_exact_rps": plan.lambda_max}
    for controller in (True, False):
        cfg = build_regions(s, plan, controller=controller)
        runs = [find_region_capacity(s, plan, cfg, requests=n, seed=seed)["max_rps"]
                for n in (4000, 16000) for seed in (0, 1, 2)]
        out["controller" if controller else "no_controller"] = {
            "max_rps": runs, "vs_plan": [round(r / plan.lambda_max - 1, 4) for r in runs]}
    return out


def main() -> dict:
    started = time.perf_counter()
    s = load_scenario("two-regions")
    with tempfile.TemporaryDirectory() as tmp:
        result = reproduce_regions(s, Path(tmp), lambda label: None)
        IMG.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(result["plots"][0]), IMG)
    result["plots"] = [str(IMG.relative_to(HERE.parent))]
    plan = plan_regions(s, "exact", "throughput")["prfaas_pd"]
    cfg = build_regions(s, plan)
    seeds = {}
    for requests in (4000, 16000):
        runs = [find_region_capacity(s, plan, cfg, requests=requests, seed=seed)["max_rps"]
                for seed in (0, 1, 2)]
        seeds[str(requests)] = {"max_rps": runs,
                                "vs_plan": [round(r / plan.lambda_max - 1, 4) for r in runs]}
    result["capacity_seeds"] = seeds
    result["k1_case_study"] = k1_case_study()
    result["command"] = "PYTHONPATH=src python benchmarks/bench_regions.py"
    result["wall_s"] = round(time.perf_counter() - started, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    out = main()
    print(json.dumps({"capacity": {k: v["max_rps"] for k, v in out["capacity"].items()},
                      "capacity_seeds": out["capacity_seeds"], "wall_s": out["wall_s"]},
                     indent=2))
