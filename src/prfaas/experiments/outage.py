"""A remote outage live, beside the simulator's `--outage link@START+DURATION` of the same run.

What `prfaas simulate --outage` predicts (what an outage of the PrfaaS side costs in TTFT and
throughput), measured on the emulated deployment of the same scenario: the planner's PrfaaS-PD
split (paper case study: 4 PrfaaS + 3 PD-P + 5 PD-D) at `load` x the simulator's capacity,
uniform arrivals, and for DURATION scenario seconds from START the inter-DC link partitioned.

Live, the partition is the shared netns link's veth going down (deploy/faults.py): KV in flight
stops, the router's health checks of the PrfaaS workers fail and membership takes them down, so
the same policy object routes every request to the PD cluster; attempts that were on PrfaaS are
retried or resumed locally (serve/router/failover.py). Simulated, the same workload with the link
outage scheduled (sim/outages.py): the link reports down at START exactly, and what was in
flight is re-run on the local path. The live router learns of the partition only from failed
checks and transfers, a lag the simulator does not model; `detect_s` reports it (first arrival
after START that went local, minus START).

Live runs twice: `as_simulated`, with no admission limit (every request queues, as in the
simulator), and `default`, with the topology's admission (a prefill queue of 32 answers 429 +
Retry-After: those requests are shed, never accepted, and counted apart from lost ones).

Figures, per side, in scenario units, for three windows of the outage's length (`before`,
`during`, `after`, by arrival time): arrivals, TTFT mean / P50 / P99, first tokens per second in
the window, share prefilled locally, requests not completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.emulated.backend import emulated_config
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.runs import RunRecord, deployed, from_sim, live, probe_workload
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario
from prfaas.serve.deploy.faults import Fault, FaultRunner
from prfaas.serve.deploy.netns import netns_available
from prfaas.serve.resilience import AdmissionSpec
from prfaas.sim.outages import LINK, Outage
from prfaas.sim.policy_run import run_policy

SYSTEM = "prfaas_pd"


def windows(rec: RunRecord, outage: Outage, a: float) -> dict[str, dict[str, Any]]:
    """`before` / `during` / `after` figures of one run (live times / a = scenario s)."""
    arrival, ttft = rec.arrival_s / a, (rec.ready_s - rec.arrival_s) / a
    ready = rec.ready_s / a
    d = outage.duration_s
    bounds = {"before": (outage.start_s - d, outage.start_s),
              "during": (outage.start_s, outage.end_s),
              "after": (outage.end_s, outage.end_s + d)}
    out = {}
    for name, (lo, hi) in bounds.items():
        sel = (arrival >= lo) & (arrival < hi)
        t = ttft[sel & np.isfinite(ttft)]

        def pct(q: float, t: np.ndarray = t) -> float | None:
            return round(float(np.percentile(t, q)), 3) if t.size else None

        out[name] = {"start_s": lo, "end_s": hi, "arrived": int(sel.sum()),
                     "ttft_s": {"mean": round(float(t.mean()), 3) if t.size else None,
                                "p50": pct(50), "p99": pct(99)},
                     "first_tokens_per_s": round(float(((ready >= lo) & (ready < hi)).sum())
                                                 / (hi - lo), 4),
                     "local_share": round(float((~rec.remote[sel]).mean()), 4)
                     if sel.any() else None,
                     "not_completed": int((sel & ~np.isfinite(rec.finish_s)).sum())}
    return out


def outage_live(outage: Outage, scales: Scales | None = None, load: float = 0.7,
                scenario: str = "paper-case-study",
                tick: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    if outage.target != LINK:
        raise ConfigError("--outage", outage.as_text(), "live, only the inter-DC link can be "
                          "taken down (link@START+DURATION); killed workers are restarted by "
                          "the supervisor (see tests/serve/test_serve_recovery.py)")
    if outage.start_s < outage.duration_s:
        raise ConfigError("--outage", outage.as_text(), "START must be >= DURATION (the "
                          "`before` window is as long as the outage)")
    if not 0 < load < 1.5:
        raise ConfigError("--load", load, "must be in (0, 1.5): a fraction of the capacity")
    if not netns_available():
        raise ConfigError("link", "netns", "the live outage needs root, ip and tc (a "
                          "kernel-shaped link the PrfaaS workers share)")
    sc = scales or Scales()
    a = sc.time
    es = emulated_system(load_scenario(scenario), SYSTEM, sc, link_emulation="netns")
    scaled = es.scaled.scenario
    # live req/s: the planner's capacity of the scaled system (= the scenario's / a)
    cap_live = plan_all(scaled, mode="exact").systems[SYSTEM].lambda_max
    rate = load * cap_live
    span = outage.end_s + outage.duration_s  # arrivals until the `after` window ends
    n = int(rate * span * a)
    workload = probe_workload(scaled.lengths, scaled.output_tokens, rate, n, seed=4)
    live_outage = Outage(LINK, outage.start_s * a, outage.duration_s * a)
    tick(f"{n} requests at {rate * a:.3f} req/s (scenario), link down "
         f"{outage.start_s:g}-{outage.end_s:g} s")
    runs = {}
    # `as_simulated`: no admission limit, as the simulator (every request queues); `default`:
    # the topology's admission (429 + Retry-After once a prefill queue holds 32)
    for label, admission in (("as_simulated", AdmissionSpec(n + 1, n + 1)),
                             ("default", es.topology.admission)):
        topo = replace(es.topology, admission=admission)
        with deployed(topo) as dep:
            tick(f"{label}: deployment up")
            assert dep.netns is not None
            runner = FaultRunner(dep.netns, Fault("partition", live_outage.start_s,
                                                  live_outage.duration_s),
                                 time.monotonic()).start()
            rec = live(dep.url, emulated_config(es.scaled).name, workload,
                       [p.pid for p in dep.procs.values()], seed=5)
            runner.join()
        runs[label] = {"windows": windows(rec, outage, a), "shed": rec.shed,
                       "lost": rec.errors - rec.shed, "error_samples": list(rec.error_samples),
                       "admission": asdict(admission), "cpu_share": rec.cpu_share,
                       "loadavg_1m": rec.loadavg, "partition_window_live_s": runner.window}
        tick(f"{label}: live run done")
    sim, summary = run_policy(scaled, SYSTEM, es.topology.policy, workload,
                              threshold_tokens=es.sim_config.threshold_tokens,
                              n_p=es.sim_config.n_p, n_d=es.sim_config.n_d,
                              kv_layers=es.scaled.layout.num_layers, outages=[live_outage])
    srec = from_sim(sim, workload)
    return {"scenario": scenario, "system": SYSTEM, "scales": sc.to_json(),
            "outage": outage.as_text(), "load": load,
            "rate_rps": round(rate * a, 4), "planner_capacity_rps": round(cap_live * a, 4),
            "requests": n, "units": "scenario s and req/s (live / time scale); emulated compute",
            "live": runs,
            "sim": {"windows": windows(srec, outage, a), "lost": summary.get("lost"),
                    "rerun_requests": summary.get("rerun_requests")}}
