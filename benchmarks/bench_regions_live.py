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

Run: flock /work/heavy.lock .venv/bin/python benchmarks/bench_regions_live.py [--quick]
     [--only partition|fairness] [--fairness-s S]
Writes benchmarks/results/regions_live.json (--quick: regions_live_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from prfaas.emulated.scales import Scales
from prfaas.experiments.regions_live import (
    fairness_runs,
    gateway_status,
    partition_run,
    regions_setup,
    with_policy,
)

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "two-regions-live"
SCALES = Scales(time=0.5, bytes=2e-3, tokens=8, output=64)
LOAD = 0.8  # fairness: as the simulator's fairness runs (0.85)
PARTITION_LOAD = 0.6  # partition: queues short enough that a 60 s window's TTFT is not noise
CUT = "far"
HOG = "far"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("partition", "fairness"), default=None)
    parser.add_argument("--fairness-s", type=float, default=240.0,
                        help="scenario seconds of arrivals per fairness run")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
