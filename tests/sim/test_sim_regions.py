"""The multi-cluster simulator on two-regions: short runs, the capacity against the exact plan,
fairness with DRR and its FCFS negative control, the egress budget, and the CLI's JSON."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from prfaas.cli import cli
from prfaas.planner.regions import MultiPlan
from prfaas.planner.regions_plan import plan_regions
from prfaas.scenario import Scenario, load_scenario
from prfaas.sim.regions_run import (
    build_regions,
    fairness_runs,
    find_region_capacity,
    region_workloads,
    simulate_regions,
)
from prfaas.workload.arrivals import make_arrivals


@pytest.fixture(scope="module")
def two() -> Scenario:
    return load_scenario("two-regions")


@pytest.fixture(scope="module")
def plan(two: Scenario) -> MultiPlan:
    return plan_regions(two, "exact", "throughput")["prfaas_pd"]


def run(two: Scenario, plan: MultiPlan, rates: dict[str, float], share: str = "drr",
        requests: int = 1500) -> dict:
    return simulate_regions(build_regions(two, plan, share), region_workloads(
        two, rates, make_arrivals("uniform"), requests=requests, seed=3))


def test_a_short_run_keeps_up_and_is_deterministic(two: Scenario, plan: MultiPlan) -> None:
    rates = {k: 0.7 * p.lambda_max for k, p in plan.pd_clusters.items()}
    first, again = run(two, plan, rates), run(two, plan, rates)
    assert first == again
    for name, c in first["pd_clusters"].items():
        assert c["completed"] == c["requests"]
        assert c["throughput_rps"] == pytest.approx(rates[name], rel=0.03)
        assert c["offload_fraction"] == pytest.approx(plan.pd_clusters[name].offload_fraction,
                                                      abs=0.04)
        assert c["ttft_p50_s"] <= c["ttft_p90_s"]
    assert first["pd_clusters"]["near"]["egress_gbps"] > first["pd_clusters"]["far"][
        "egress_gbps"]


def test_capacity_is_within_3_percent_of_the_exact_plan(two: Scenario, plan: MultiPlan
                                                        ) -> None:
    """The median over seeds 0-2 (one seed's search moves by up to ~8% on this scenario, where
    near's PD-P, its decode and the shared PrfaaS pool are all at the plan's edge at once:
    docs/multi-region.md lists every seed's figure)."""
    cfg = build_regions(two, plan)
    results = [find_region_capacity(two, plan, cfg, requests=4000, seed=seed)
               for seed in (0, 1, 2)]
    median = sorted(r["max_rps"] for r in results)[1]
    assert median == pytest.approx(plan.lambda_max, rel=0.03)
    assert all(any(not p["sustainable"] for p in r["probes"]) for r in results)  # an edge


def test_drr_protects_the_other_region_and_fcfs_does_not(two: Scenario, plan: MultiPlan
                                                         ) -> None:
    out = fairness_runs(two, plan, duration_s=600.0)
    for hog in ("near", "far"):
        victim = "far" if hog == "near" else "near"
        drr = out["policies"]["drr"]["overloaded"][hog]["victims"][victim]
        fcfs = out["policies"]["fcfs"]["overloaded"][hog]["victims"][victim]
        assert drr["throughput_ratio"] >= 0.9 and drr["ttft_p90_ratio"] <= 1.25, (hog, drr)
        assert fcfs["ttft_p90_ratio"] > 2.0, (hog, fcfs)  # the negative control
        assert not fcfs["holds"]


def test_the_egress_budget_caps_a_destination(two: Scenario, plan: MultiPlan) -> None:
    rates = {k: 0.8 * p.lambda_max for k, p in plan.pd_clusters.items()}
    work = region_workloads(two, rates, make_arrivals("uniform"), requests=1500, seed=3)
    cfg = build_regions(two, plan)
    tight = replace(cfg, regions=tuple(replace(r, budget_gbps=4.0) if r.name == "near" else r
                                       for r in cfg.regions))
    free, capped = simulate_regions(cfg, work), simulate_regions(tight, work)
    assert free["pd_clusters"]["near"]["egress_gbps"] > 6.0
    # one prefill at a time toward near: at most one instance's KV rate (< 3.7 Gbps, Eq. 1)
    assert capped["pd_clusters"]["near"]["egress_gbps"] < 3.7
    assert capped["prfaas"]["busy_share"]["far"] > free["prfaas"]["busy_share"]["far"]


def test_cli_plan_and_simulate_json(two: Scenario) -> None:
    runner = CliRunner()
    plan = json.loads(runner.invoke(cli, ["plan", "--scenario", "two-regions", "--json"]).output)
    prf = plan["systems"]["prfaas_pd"]
    assert set(prf["pd_clusters"]) == {"near", "far"}
    for key in ("threshold_tokens", "n_p", "n_d", "lambda_max", "egress_gbps"):
        assert key in prf["pd_clusters"]["far"]
    assert prf["lambda_max"] > plan["systems"]["whole_request_routing"]["lambda_max"]
    assert {"all_remote", "alone"} <= set(plan["systems"])
    res = runner.invoke(cli, ["simulate", "--scenario", "two-regions", "--rate-of", "near=1.5",
                              "--rate-of", "far=0.5", "--requests", "400", "--json"])
    sim = json.loads(res.output)
    assert sim["rates_rps"] == {"near": 1.5, "far": 0.5}
    for key in ("throughput_rps", "ttft_p50_s", "ttft_p90_s", "offload_fraction",
                "egress_gbps"):
        assert key in sim["pd_clusters"]["near"]
    bad = runner.invoke(cli, ["simulate", "--scenario", "two-regions", "--rate-of", "mid=1"])
    assert bad.exit_code != 0
    for flags in (["--threshold", "4000"], ["--n-p", "2"], ["--rebalance"],
                  ["--outage", "near@10+5"]):
        ignored = runner.invoke(cli, ["simulate", "--scenario", "two-regions",
                                      "--requests", "50", *flags])
        assert ignored.exit_code != 0 and "several PD clusters" in str(ignored.exception)
