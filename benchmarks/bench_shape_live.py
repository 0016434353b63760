"""The shape controller, live on Ray and simulated: a mix that shifts, the shape fixed or
controlled.

    python benchmarks/bench_shape_live.py --out DIR [--quick]   (run it under /work/bin/heavy)

Writes DIR/shape.json. Protocol (fixed before any run; docs/shape.md renders the figures):
- deployment: scenario `shape-shift` (paper-case-study hardware: 1 PrfaaS H200 instance, 4 PD
  H20 instances), emulated engine at the default scales (time 0.2, bytes 2e-3, tokens 8,
  output 64), the planner's split for the first phase's mix (1 PD-P : 3 PD-D, t = 3100),
  policy prfaas-threshold+controller (the threshold controller: period 2 s, a window of 60
  requests, in live seconds) on a 3-node Ray cluster on 127.0.0.1 (router; dc_prfaas; dc_local);
- workload (scenario units, seed 0): short-heavy (log-normal median 3000 tokens, sigma 0.8) at
  1.8 req/s, long-heavy (median 30000, sigma 0.6) at 0.8 req/s, short-heavy again at 1.8 req/s,
  600 s each (120 live s; --quick: 300 s each), 1024 output tokens;
- runs: live fixed, live controlled, simulated fixed, simulated controlled (the same workload;
  the simulator runs the router's policy object built from the same topology, and the shape
  controller's class with the same SHAPE settings);
- gain = throughput of the long-heavy phase with the controller / without - 1 (throughput:
  requests finished within the phase / its length); the live gain agrees when
  |live - sim| <= 10% of the simulated gain;
- texts: every request in flight on an instance when its change began, plus a sample of 50
  others, compared with the emulated engine's single-process `generate` (its `prfaas generate`).
Live figures come from a 2-core host shared by every process of the deployment (Ray's included):
they are distorted by that sharing, and the JSON says so beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.emulated.backend import emulated_config, emulated_engine
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.shape_live import (
    Outcome,
    Phase,
    caught_in_changes,
    check_texts,
    gain,
    live_run,
    pd_topology,
    phase_figures,
    phased_workload,
    scaled_phases,
    simulate_run,
    within,
)
from prfaas.policy.shape import ShapeConfig
from prfaas.serve.deploy.ray.loopback import loopback_cluster

SCENARIO, SEED = "shape-shift", 0
PHASES = (Phase("short-heavy", 3000, 0.8, 1.8, 600.0), Phase("long-heavy", 30000, 0.6, 0.8, 600.0),
          Phase("short-heavy again", 3000, 0.8, 1.8, 600.0))
GAIN_PHASE = 1
QUICK_FACTOR = 0.5
CONTROLLER = {"period_s": 2.0, "window_requests": 60, "min_window": 30}
# live seconds: a 15 s window (halves of >= 15 requests), 2 s solves, 4 s of agreement, a
# restart priced at 6 s (an emulated worker's process start on this host, measured by
# tests/deploy/test_ray_shape.py's runs), a 20 s hold against flapping
SHAPE = ShapeConfig(period_s=2.0, window_s=15.0, min_window=30, persist_s=4.0, cooldown_s=4.0,
                    hold_s=20.0, switch_s=6.0, payback_s=60.0, min_gain=0.1)
SAMPLE = 50
HOST = ("2 shared cores: the router, 5 emulated workers, their Ray actors and 3 raylets share "
        "them; live timings are distorted by that sharing")


def figures(out: Outcome, pw: Any) -> dict[str, Any]:
    return {"phases": phase_figures(pw, out.arrival_s, out.ready_s, out.finish_s, 1.0),
            "lost": out.lost, "shed": out.shed, "role_changes": out.role_changes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sim-only", action="store_true", help="the simulated runs only")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    phases = scaled_phases(PHASES, QUICK_FACTOR) if args.quick else PHASES
    es = emulated_system(SCENARIO, "prfaas_pd", link_emulation="token-bucket",
                         policy="prfaas-threshold+controller",
                         policy_args={"controller": CONTROLLER})
    pw = phased_workload(es.scaled, phases, SEED)
    fixed, controlled = pd_topology(es, None), pd_topology(es, SHAPE)
    t0 = time.monotonic()

    def tick(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    sim = {name: simulate_run(es, topo, pw, topo.shape) for name, topo in
           (("fixed", fixed), ("controlled", controlled))}
    tick(f"simulated: {len(pw.workload)} requests; role changes "
         f"{[(c['at_s'], c['instance'], c['to']) for c in sim['controlled'].role_changes]}")
    live: dict[str, Outcome] = {}
    if not args.sim_only:
        model = emulated_config(es.scaled).name
        with loopback_cluster() as cluster:
            tick(f"Ray cluster at {cluster.address}")
            for name, topo in (("fixed", fixed), ("controlled", controlled)):
                live[name] = live_run(cluster.address, topo, pw, model, SEED, tick=tick)
                tick(f"live {name}: lost {live[name].lost}, shed {live[name].shed}, role changes "
                     f"{[(c['at_s'], c['instance'], c['to']) for c in live[name].role_changes]}")
    result = report(pw, sim, live, args.quick)
    path = out_dir / "shape.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    tick(f"wrote {path}: gain live {result['gain'].get('live')} sim {result['gain']['sim']}, "
         f"within: {result['gain']['within_10pct']}")
    return 0


def report(pw: Any, sim: dict[str, Outcome], live: dict[str, Outcome], quick: bool
           ) -> dict[str, Any]:
    sides = {"sim": {k: figures(v, pw) for k, v in sim.items()},
             "live": {k: figures(v, pw) for k, v in live.items()}}
    phases = []
    for k, ph in enumerate(pw.phases):
        entry: dict[str, Any] = {"name": ph.name, "scenario": {
            "median_tokens": ph.median_tokens, "sigma": ph.sigma, "rate_rps": ph.rate_rps,
            "duration_s": ph.duration_s}}
        for side, runs in sides.items():
            entry[side] = {run: {key: f["phases"][k][key] for key in
                                 ("throughput_rps", "ttft_p50_s", "ttft_p90_s", "requests",
                                  "completed")} for run, f in runs.items()}
        phases.append(entry)
    gains = {side: round(gain(runs["fixed"]["phases"][GAIN_PHASE]["throughput_rps"],
                              runs["controlled"]["phases"][GAIN_PHASE]["throughput_rps"]), 4)
             for side, runs in sides.items() if runs}
    texts: dict[str, Any] = {}
    live_ctl = live.get("controlled")
    if live_ctl is not None:
        es_model = emulated_system(SCENARIO, "prfaas_pd", link_emulation="token-bucket")
        reference = emulated_engine(es_model.topology.model, "prfaas")
        caught = caught_in_changes(live_ctl)
        rng = np.random.default_rng(SEED)
        others = [int(i) for i in rng.choice(len(pw.workload), SAMPLE, replace=False)
                  if int(i) not in caught]
        texts = {"caught": check_texts(live_ctl, pw, SEED, reference, caught),
                 "sample": check_texts(live_ctl, pw, SEED, reference, others),
                 "reference": "the emulated engine's single-process generate"}
    lost = sum(o.lost for o in live.values()) if live else None
    return {
        "backend": "emulated", "scenario": SCENARIO, "quick": quick, "seed": SEED,
        "units": "live seconds and live req/s of the emulated deployment (scenario values: "
                 "seconds / 0.2, req/s x 0.2)",
        "host": HOST if live else None, "loadavg_1m": {k: v.extra["loadavg_1m"]
                                                       for k, v in live.items() if v.extra},
        "shape_config": asdict(SHAPE),
        "threshold_controller": CONTROLLER, "requests": len(pw.workload),
        "lost": lost,
        "shed": {k: v.shed for k, v in live.items()},
        "role_changes": live_ctl.role_changes if live_ctl is not None else [],
        "sim_role_changes": sim["controlled"].role_changes,
        "phases": phases,
        "gain": {"definition": f"throughput of phase {pw.phases[GAIN_PHASE].name!r} with the "
                 "controller / without - 1", **gains,
                 "within_10pct": within(gains["live"], gains["sim"])
                 if "live" in gains else None},
        "texts": texts,
        "live_runs": {k: v.extra for k, v in live.items()},
        "sim_lost": {k: v.lost for k, v in sim.items()},
        "env": {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                               "RAY_USAGE_STATS_ENABLED")},
    }


if __name__ == "__main__":
    sys.exit(main())
