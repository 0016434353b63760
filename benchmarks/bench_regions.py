"""Benchmark: the two-regions scenario (issue 22), planned and simulated; what docs/multi-region.md
cites. Writes benchmarks/results/two_regions.json and docs/img/two_regions.png.

The same steps as `prfaas reproduce --scenario two-regions` (plans under both objectives and
modes, simulated capacity beside the exact plan, the fairness runs with DRR and FCFS), plus what
the plan-vs-simulator comparison rests on (docs/multi-region.md):
- `capacity_seeds`: the sustained-rate search (the house rule) over seeds 0-2 at 4,000, 16,000
  and 64,000 requests per probe; `k1_case_study` the same on the case study with K = 1;
- `saturation`: the capacity the fluid plan defines (every cluster offered 1.1x, 1.2x, 1.5x its
  planned rate, t held at the plan; completions per second), two-regions and K = 1, seeds 0-2;
- `utilization`: per-stage utilisation in the simulator beside the plan's at 95% of the plan;
- `growth_noise`: the house queue-growth statistic of a stationary system (95% and 97% of the
  plan, 12 seeds) at each probe length: its spread and how often it exceeds the allowance
  (`--only growth_noise` recomputes just that key);
- `long_runs`: the number in system per sixteenth of a 256,000-request run at 99% of the plan,
  with the threshold controller as shipped and with the previous rule (no hold between moves).
Deterministic: no wall-clock figure but `wall_s`. A few minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from prfaas.planner.regions import MultiPlan, region_inputs
from prfaas.planner.regions_plan import plan_regions
from prfaas.planner.throughput import decode_rate, stage_curves
from prfaas.scenario import Scenario, load_scenario, parse_scenario
from prfaas.sim.regions import RegionsConfig, RegionsSimulator
from prfaas.sim.regions_report import reproduce_regions
from prfaas.sim.regions_run import (
    _cluster_metrics,
    build_regions,
    find_region_capacity,
    region_workloads,
    saturation_capacity,
    simulate_regions,
)
from prfaas.workload.arrivals import make_arrivals

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


PROBE_REQUESTS = (4000, 16000, 64000)
SEEDS = (0, 1, 2)


def capacity_by_length(s: Scenario, plan: MultiPlan, cfg: RegionsConfig) -> dict:
    """The sustained-rate search at each probe length, seeds 0-2."""
    out = {}
    for requests in PROBE_REQUESTS:
        runs = [find_region_capacity(s, plan, cfg, requests=requests, seed=seed)["max_rps"]
                for seed in SEEDS]
        out[str(requests)] = {"max_rps": runs,
                              "vs_plan": [round(r / plan.lambda_max - 1, 4) for r in runs]}
    return out


def saturation(s: Scenario, plan: MultiPlan) -> dict:
    """Completions per second with every cluster overloaded, t at the plan (controller off);
    and at 1.2x with the controller on, for what it does under overload."""
    out: dict = {}
    fixed = build_regions(s, plan, controller=False)
    for overload in (1.1, 1.2, 1.5):
        runs = [saturation_capacity(s, plan, fixed, overload=overload, seed=seed)
                for seed in SEEDS]
        out[f"{overload:g}"] = {"vs_plan": [r["vs_plan"] for r in runs],
                                "vs_plan_of": [r["vs_plan_of"] for r in runs],
                                "max_rps": [r["max_rps"] for r in runs]}
    runs = [saturation_capacity(s, plan, build_regions(s, plan), overload=1.2, seed=seed)
            for seed in SEEDS]
    out["1.2_controller"] = {"vs_plan": [r["vs_plan"] for r in runs],
                             "vs_plan_of": [r["vs_plan_of"] for r in runs]}
    first = next(iter(plan.pd_clusters))  # the test's negative control: one PD-P instance short
    short = replace(fixed, regions=tuple(replace(r, n_p=r.n_p - 1) if r.name == first else r
                                         for r in fixed.regions))
    bad = saturation_capacity(s, plan, short, overload=1.2, seed=0)
    out["1.2_one_pd_p_short"] = {"cluster": first, "vs_plan_of": bad["vs_plan_of"]}
    out["requests"] = 16000
    return out


def planned_utilization(s: Scenario, plan: MultiPlan) -> dict:
    """Each stage's utilisation at the plan's rates (the exact model's E[T | side])."""
    out = {}
    for r in s.pd_clusters:
        p = plan.pd_clusters[r.name]
        inputs = region_inputs(s, r, s.prfaas.instances)
        cv = stage_curves(inputs.lengths, np.array([float(p.threshold_tokens or 0)]),
                          inputs.prfaas_prefill, inputs.pd_prefill, inputs.kv, "exact")
        d = inputs.decode
        theta_d = float(decode_rate(p.n_d, d.bs_max, d.step_at(d.bs_max), r.output_tokens))
        out[r.name] = {
            "pd_p": float(p.lambda_max * cv.p_short[0] * cv.short_service_s[0] / p.n_p)
            if p.n_p else None,
            "decode": p.lambda_max / theta_d,
            "prfaas_instances": float(p.lambda_max * cv.p_long[0] * cv.long_service_s[0])}
    return out


def utilization(s: Scenario, plan: MultiPlan, cfg: RegionsConfig, scale: float = 0.95) -> dict:
    """The simulator's per-stage utilisation at `scale` x the plan (16,000 requests, seed 0)
    beside the plan's at the same scale; and the PrfaaS instances each cluster was planned."""
    run = simulate_regions(cfg, region_workloads(
        s, {k: p.lambda_max * scale for k, p in plan.pd_clusters.items()},
        make_arrivals("uniform"), requests=16000, seed=0))
    planned = planned_utilization(s, plan)
    return {"scale": scale, "simulated": {k: c["utilization"] for k, c in
                                          run["pd_clusters"].items()},
            "in_system_mean": {k: c["in_system_mean"] for k, c in run["pd_clusters"].items()},
            "ttft_p90_s": {k: c["ttft_p90_s"] for k, c in run["pd_clusters"].items()},
            "planned": {k: {st: None if v is None else round(v * scale, 4)
                            for st, v in u.items()} for k, u in planned.items()},
            "planned_prfaas_share_instances": {k: round(p.prfaas_instances, 4)
                                               for k, p in plan.pd_clusters.items()}}


def growth_noise(s: Scenario, plan: MultiPlan, cfg: RegionsConfig,
                 scales: tuple[float, ...] = (0.95, 0.97), seeds: int = 12) -> dict:
    """The house queue-growth statistic of near (the cluster whose verdict fails) at loads the
    long runs show stationary: mean, spread and share over the allowance per probe length."""
    return {"seeds": seeds, "cluster": "near", "by_scale": {
        f"{scale:g}": _growth_at(s, plan, cfg, scale, seeds) for scale in scales}}


def _growth_at(s: Scenario, plan: MultiPlan, cfg: RegionsConfig, scale: float, seeds: int
               ) -> dict:
    out = {}
    for requests in PROBE_REQUESTS:
        growth, over = [], 0
        for seed in range(seeds):
            run = simulate_regions(cfg, region_workloads(
                s, {k: p.lambda_max * scale for k, p in plan.pd_clusters.items()},
                make_arrivals("uniform"), requests=requests, seed=seed))
            c = run["pd_clusters"]["near"]
            growth.append(c["queue_growth"])
            over += not c["sustainable"]
        out[str(requests)] = {"mean": round(float(np.mean(growth)), 2),
                              "sd": round(float(np.std(growth)), 2),
                              "unsustainable_share": round(over / seeds, 3)}
    return out


def long_runs(s: Scenario, plan: MultiPlan, scale: float = 0.99, requests: int = 256000
              ) -> dict:
    """In-system counts per sixteenth of a long run at `scale` x the plan, controller as
    shipped (hold 60 s between moves of t) and as before (hold 0: a move on every arrival)."""
    out: dict = {"scale": scale, "requests": requests}
    for label, hold in (("hold_60s", None), ("hold_0s_previous_rule", 0.0)):
        cfg = build_regions(s, plan)
        runs = []
        for seed in SEEDS:
            work = region_workloads(s, {k: p.lambda_max * scale
                                        for k, p in plan.pd_clusters.items()},
                                    make_arrivals("uniform"), requests=requests, seed=seed)
            sim = RegionsSimulator(cfg, work)
            if hold is not None:
                for reg in sim.regions:
                    reg.control = replace(reg.control, hold_s=hold)
            sim.run()
            runs.append({reg.setup.name: {
                "in_system_by_sixteenth": [round(float(c.mean()), 1) for c in
                                           np.array_split(reg.in_system_seen, 16)],
                "throughput_share": round(m["throughput_rps"] / m["offered_rps"], 4),
                "threshold_changes": m["threshold_changes"]}
                for reg in sim.regions for m in [_cluster_metrics(reg)]})
        out[label] = runs
    return out


def k1_case_study() -> dict:
    """The multi-cluster loop on the one-cluster case study, K = 1: the same sustained-rate
    searches (controller on and off) and saturation capacity as two-regions."""
    s = one_region()
    plan = plan_regions(s, "exact", "throughput")["prfaas_pd"]
    out: dict = {"planned_exact_rps": plan.lambda_max}
    for controller in (True, False):
        cfg = build_regions(s, plan, controller=controller)
        by_length = capacity_by_length(s, plan, cfg)
        out["controller" if controller else "no_controller"] = {
            "by_requests": by_length,
            "max_rps": [r for n in PROBE_REQUESTS for r in by_length[str(n)]["max_rps"]],
            "vs_plan": [v for n in PROBE_REQUESTS for v in by_length[str(n)]["vs_plan"]]}
    out["saturation"] = saturation(s, plan)
    return out


def only_growth_noise() -> dict:
    """`--only growth_noise`: recompute that key alone into the committed results file (the
    rest of the file is what the full run wrote; every step is deterministic)."""
    started = time.perf_counter()
    result = json.loads(OUT.read_text())
    s = load_scenario("two-regions")
    plan = plan_regions(s, "exact", "throughput")["prfaas_pd"]
    result["growth_noise"] = growth_noise(s, plan, build_regions(s, plan))
    result["growth_noise"]["wall_s"] = round(time.perf_counter() - started, 1)
    OUT.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


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
    result["capacity_seeds"] = capacity_by_length(s, plan, cfg)
    off = build_regions(s, plan, controller=False)
    runs = [find_region_capacity(s, plan, off, requests=16000, seed=seed)["max_rps"]
            for seed in SEEDS]
    result["capacity_seeds_no_controller"] = {"16000": {
        "max_rps": runs, "vs_plan": [round(r / plan.lambda_max - 1, 4) for r in runs]}}
    result["saturation"] = saturation(s, plan)
    result["utilization"] = utilization(s, plan, cfg)
    result["growth_noise"] = growth_noise(s, plan, cfg)
    result["long_runs"] = long_runs(s, plan)
    result["k1_case_study"] = k1_case_study()
    result["command"] = "PYTHONPATH=src python benchmarks/bench_regions.py"
    result["wall_s"] = round(time.perf_counter() - started, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["growth_noise"],
                        help="run and print only this section")
    if parser.parse_args().only == "growth_noise":
        print(json.dumps(only_growth_noise()["growth_noise"], indent=2))
        raise SystemExit(0)
    out = main()
    print(json.dumps({"capacity": {k: v["max_rps"] for k, v in out["capacity"].items()},
                      "capacity_seeds": out["capacity_seeds"], "wall_s": out["wall_s"]},
                     indent=2))
