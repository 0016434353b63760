"""Two PD clusters sharing one PrfaaS cluster, live on emulated hardware (issue 22).

Scenario `two-regions-live` (two-regions at half size: 2 PrfaaS H200 instances, two PD clusters
of 4 H20 instances, near over 100 Gbps, far over the 20.58 Gbps public-internet path), deployed
by experiments/regions_live.py: emulated workers (compute = the hardware profile's time, KV of
the model's geometry scaled), a kernel-shaped veth per region (tc tbf at its scaled rate; RTT
and loss not emulated), the tenant gateway with the simulator's DRR / FCFS and egress-budget
objects, one router per region at its planned t. Scales: time 0.5 (one live s = 2 scenario s of
work), bytes 2e-3, tokens / 8, output tokens / 64. Figures in scenario units.

Sections (each on a fresh deployment, written to the JSON as it finishes):
- `partition`: both regions at PARTITION_LOAD x plan; the far region's link down for 60
  scenario s; the near region's TTFT (arrival to KV at its decoder) P50 / P90 / mean in the 60 s
  before and the 60 s of the cut, by arrival time. Must show: within 10% of before. Beside it,
  the simulator on the same requests without the cut, and its own ratio of the same two windows
  (the windows' spread with no fault).
- `fairness_drr`, `fairness_fcfs`: the fair run (both at LOAD x plan) and the far region at 3x
  its plan, the near region at LOAD x plan; the near region's throughput and P90 TTFT over the
  fair run's, live and simulated (same requests, controller off). Must show with DRR: >= 0.90
  and <= 1.25; FCFS is the negative control.
- `budget`: near's egress budget set to BUDGET_GBPS (scenario Gbps, ~1.2x the highest KV rate
  one prefill emits, so near's KV is made by one PrfaaS prefill at a time) before planning, both
  regions at BUDGET_LOAD x that plan for BUDGET_S scenario s; then the control, a fresh
  deployment with the same plan and requests and no budget. Per destination: the picks at which
  its budget held it back (gateway and simulator), the bytes its link carried (read at the host
  end of its veth during the run and by the gateway's meter at the namespace end) and their rate
  in BUDGET_WINDOW_S windows against the budget, the simulator beside
  (experiments/regions_budget.py). Must show: near's budget_held > 0 live.
- `capacity`: the PrfaaS-PD system's capacity along the plan's mix (both regions at x times
  their planned rates, x searched) live on one deployment, and by the same search in the
  simulator on the same requests (experiments/regions_capacity.py: probe.Search from a fixed
  x = 0.25, doubling then bisecting; a region's verdict is probe.judge on its requests, the
  same function on both sides); beside them the simulator's 4000-request capacity
  (sim/regions_run.find_region_capacity, controller off) and the plan (x = 1).

Run: /work/bin/heavy .venv/bin/python benchmarks/bench_regions_live.py [--quick]
     [--only partition|fairness|budget|capacity] [--fairness-s S] [--probe-s S]
     [--max-probes N]
Writes benchmarks/results/regions_live.json (--quick: regions_live_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from prfaas.emulated.scales import Scales
from prfaas.experiments.regions_budget import budget_run, without_budgets
from prfaas.experiments.regions_capacity import (
    CapacityOptions,
    MixProbe,
    capacity_json,
    live_search,
    sim_search,
)
from prfaas.experiments.regions_live import (
    RegionsSetup,
    fairness_runs,
    gateway_status,
    partition_run,
    regions_setup,
    with_policy,
)
from prfaas.sim.regions_run import build_regions, find_region_capacity

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "two-regions-live"
SCALES = Scales(time=0.5, bytes=2e-3, tokens=8, output=64)
LOAD = 0.8  # fairness: as the simulator's fairness runs (0.85)
PARTITION_LOAD = 0.6  # partition: queues short enough that a 60 s window's TTFT is not noise
CUT = "far"
HOG = "far"
BUDGETED = "near"
BUDGET_GBPS = 4.5  # scenario Gbps; the highest KV rate of one prefill is 3.71
BUDGET_LOAD = 0.6
BUDGET_S = 240.0
BUDGET_WINDOW_S = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("partition", "fairness", "budget", "capacity"),
                        default=None)
    parser.add_argument("--fairness-s", type=float, default=240.0,
                        help="scenario seconds of arrivals per fairness run")
    parser.add_argument("--probe-s", type=float, default=CapacityOptions.probe_s,
                        help="scenario seconds of arrivals per capacity probe")
    parser.add_argument("--max-probes", type=int, default=CapacityOptions.max_probes)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out_path = ROOT / "benchmarks/results" / ("regions_live_quick.json" if args.quick
                                              else "regions_live.json")
    result: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    window_s, warmup_s = (30.0, 30.0) if args.quick else (60.0, 60.0)
    duration_s = 120.0 if args.quick else args.fairness_s
    setup = regions_setup(SCENARIO, SCALES)
    result.update({
        "command": " ".join(["bench_regions_live.py", *sys.argv[1:]]),
        "scenario": SCENARIO, "scales": SCALES.to_json(), "backend": "emulated",
        "link_emulation": "netns: one tc-tbf veth per region (rate only; RTT/loss not "
                          "emulated)",
        "planned_rps": {k: round(v, 4) for k, v in setup.planned_rps().items()},
        "plan": setup.plan.to_json(), "host_cores": os.cpu_count()})

    def save() -> None:
        out_path.write_text(json.dumps(result, indent=1) + "\n")

    if args.only in (None, "partition"):
        t0 = time.time()
        with setup.deployment() as dep:
            run = partition_run(setup, dep, cut=CUT, load=PARTITION_LOAD, warmup_s=warmup_s,
                                window_s=window_s)
            run["gateway"] = gateway_status(dep, "near")
        run["wall_s"] = round(time.time() - t0, 1)
        run["loadavg_1m_end"] = os.getloadavg()[0]
        result["partition"] = run
        save()
        near = run["regions"]["near"]
        print(f"partition of {CUT}: near TTFT ratio during/before {near['ttft_ratio']} "
              f"within 10%: {near['within_10pct']}", flush=True)
    if args.only in (None, "fairness"):
        for policy in ("drr", "fcfs"):
            t0 = time.time()
            s = with_policy(setup, policy)
            with s.deployment() as dep:
                run = fairness_runs(s, dep, hog=HOG, load=LOAD, overload=3.0,
                                    duration_s=duration_s)
            run["wall_s"] = round(time.time() - t0, 1)
            run["loadavg_1m_end"] = os.getloadavg()[0]
            result[f"fairness_{policy}"] = run
            save()
            print(f"fairness {policy}: {run['victims']}", flush=True)
    if args.only in (None, "budget"):
        result["budget"] = budget_section()
        save()
        for label, run in result["budget"]["runs"].items():
            near = run["regions"][BUDGETED]
            print(f"budget, {label}: {BUDGETED} held live {near['live']['budget_held']} / sim "
                  f"{near['sim']['budget_held']}; {BUDGET_WINDOW_S:g} s windows max "
                  f"{near['live']['max_gbps']} Gbps live / {near['sim']['max_gbps']} sim, "
                  f"budget {near['budget_gbps']}", flush=True)
    if args.only in (None, "capacity"):
        opts = CapacityOptions(probe_s=60.0 if args.quick else args.probe_s,
                               max_probes=4 if args.quick else args.max_probes)

        def partial(part: dict[str, Any]) -> None:
            result["capacity_partial"] = part
            save()

        result["capacity"] = {"command": result["command"], **capacity(setup, opts, partial)}
        result.pop("capacity_partial", None)
        save()
        c = result["capacity"]
        print(f"capacity: live x {c['live']['bracket_scale']}, sim x "
              f"{c['sim']['bracket_scale']}, sim 4000-request x {c['sim_long']['scale']}",
              flush=True)
    return 0


def budget_section() -> dict[str, Any]:
    """The budgeted run, then the control (same plan and requests, no budget), each on a
    fresh deployment."""
    budgeted = regions_setup(SCENARIO, SCALES, budgets_gbps={BUDGETED: BUDGET_GBPS})
    out: dict[str, Any] = {"destination": BUDGETED, "budget_gbps": BUDGET_GBPS,
                           "planned_rps": {k: round(v, 4)
                                           for k, v in budgeted.planned_rps().items()},
                           "plan": budgeted.plan.to_json(), "runs": {}}
    for label, setup in (("budget", budgeted), ("control_no_budget",
                                                without_budgets(budgeted))):
        t0 = time.time()
        with setup.deployment() as dep:
            run = budget_run(setup, dep, load=BUDGET_LOAD, duration_s=BUDGET_S,
                             window_s=BUDGET_WINDOW_S)
        run.update(wall_s=round(time.time() - t0, 1), loadavg_1m_end=os.getloadavg()[0])
        out["runs"][label] = run
    return out


def capacity(setup: RegionsSetup, opts: CapacityOptions,
             partial: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Simulated search first (it needs no deployment), then the live one on one deployment;
    each live probe is saved as it finishes (`capacity_partial`)."""
    t0 = time.time()
    sim = sim_search(setup, opts)
    long = find_region_capacity(setup.scenario, setup.plan, build_regions(
        setup.scenario, setup.plan, setup.share_policy, controller=False), requests=4000)
    done: list[dict[str, Any]] = []

    def on_probe(p: MixProbe) -> None:
        done.append(p.to_json())
        partial({"probes": done, "wall_s": round(time.time() - t0, 1)})
        print(f"capacity probe x={p.scale:.4f}: live {'ok' if p.sustainable else 'over'}, "
              f"sim {'ok' if done[-1]['sim_sustained'] else 'over'} "
              f"({time.time() - t0:.0f} s)", flush=True)

    with setup.deployment() as dep:
        live = live_search(setup, dep, opts, on_probe)
        gateway = gateway_status(dep, "near")
    out = capacity_json(setup, opts, live, sim, long)
    out.update(gateway=gateway, wall_s=round(time.time() - t0, 1),
               loadavg_1m_end=os.getloadavg()[0], sim_spread=sim_spread(setup, opts))
    return out


def sim_spread(setup: RegionsSetup, opts: CapacityOptions) -> dict[str, Any]:
    """How much the simulated search's answer moves with the probe length and seed alone
    (the noise floor of a capacity from probes this short)."""
    xs = {f"{ps:.0f}s_seed{seed}": sim_search(setup, replace(
        opts, probe_s=ps, seed=seed, max_probes=12))[1].sustained_rps
          for ps in (120.0, 140.0, 160.0, 240.0) for seed in (0, 1, 2)}
    vals = [v for v in xs.values() if v is not None]
    return {"capacity_scale": xs, "min": min(vals), "max": max(vals)}


if __name__ == "__main__":
    sys.exit(main())
