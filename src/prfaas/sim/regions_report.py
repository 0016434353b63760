"""`prfaas reproduce` for a scenario with several PD clusters (no --live): the plan against its
baselines under both objectives, the simulated capacity of PrfaaS-PD beside the exact plan, the
fairness experiment (DRR and its FCFS negative control) and one PNG of it all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prfaas.planner.regions import OBJECTIVES
from prfaas.planner.regions_plan import plan_regions
from prfaas.scenario import Scenario
from prfaas.sim.regions_run import build_regions, fairness_runs, find_region_capacity

STEPS = 4


def plan_payload(s: Scenario, mode: str, objective: str) -> dict[str, Any]:
    systems = plan_regions(s, mode, objective)
    return {"mode": mode, "objective": objective, "scenario": s.name,
            "systems": {name: p.to_json() for name, p in systems.items()}}


def reproduce_regions(s: Scenario, folder: Path, tick: Callable[[str], None],
                      requests: int = 4000, seed: int = 0) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    plans = {f"{obj}_{mode}": plan_payload(s, mode, obj)
             for obj in OBJECTIVES for mode in ("paper", "exact")}
    tick("planned")
    exact = plan_regions(s, "exact", "throughput")["prfaas_pd"]
    capacity = {"drr": find_region_capacity(s, exact, build_regions(s, exact, "drr"),
                                            requests=requests, seed=seed)}
    tick("capacity (drr)")
    capacity["drr_16000"] = find_region_capacity(s, exact, build_regions(s, exact, "drr"),
                                                 requests=16000, seed=seed)
    tick("capacity (16,000 requests)")
    fairness = fairness_runs(s, exact, seed=seed)
    tick("fairness")
    result = {"scenario": s.name, "plans": plans, "capacity": capacity, "fairness": fairness,
              "planned_exact_rps": exact.lambda_max}
    result["plots"] = [str(regions_plot(result, folder / "two_regions.png"))]
    return result


def regions_plot(result: dict[str, Any], path: Path) -> Path:
    """Left: capacity per system (stacked by PD cluster), planned and simulated. Right: each
    victim's throughput and P90 TTFT with the other region at 3x, DRR vs FCFS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = result["plans"]["throughput_exact"]["systems"]
    names = ["prfaas_pd", "whole_request_routing", "all_remote", "alone"]
    clusters = list(plan["prfaas_pd"]["pd_clusters"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    bottom = [0.0] * len(names)
    for c in clusters:
        vals = [plan[n]["pd_clusters"][c]["lambda_max"] for n in names]
        left.bar(names, vals, bottom=bottom, label=c)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    left.axhline(result["capacity"]["drr"]["max_rps"], color="k", linestyle="--", lw=0.8,
                 label="PrfaaS-PD simulated")
    left.set_ylabel("capacity (req/s), exact plan")
    left.tick_params(axis="x", labelrotation=15)
    left.legend()
    labels, thr, p90 = [], [], []
    for policy, runs in result["fairness"]["policies"].items():
        for hog, run in runs["overloaded"].items():
            for victim, rel in run["victims"].items():
                labels.append(f"{policy}: {victim}\n({hog} at 3x)")
                thr.append(rel["throughput_ratio"] or 0.0)
                p90.append(rel["ttft_p90_ratio"] or 0.0)
    xs = range(len(labels))
    right.bar([x - 0.2 for x in xs], thr, width=0.4, label="throughput / fair run")
    right.bar([x + 0.2 for x in xs], p90, width=0.4, label="P90 TTFT / fair run")
    right.axhline(0.9, color="g", linestyle=":", lw=0.8)
    right.axhline(1.25, color="r", linestyle=":", lw=0.8)
    right.set_xticks(list(xs), labels, fontsize=8)
    right.set_yscale("log")
    right.legend(fontsize=8)
    right.set_title("fairness: the other region at 3x its planned rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
