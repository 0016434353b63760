"""The link-fluctuation experiment live: the inter-DC link drops 10x mid-run and recovers,
under a static threshold and under the bandwidth-aware controller, beside the simulator.

Set-up (scenario units; live = scales.py's mapping): the `link-fluctuation` scenario's
PrfaaS-PD with 4 PD-P + 4 PD-D and the planner's t, Poisson arrivals at 2.8 req/s (as the
simulated experiment of benchmarks/bench_policies.py) for `duration_s`, the link at its rate,
1/10 of it during [dip_start_s, dip_end_s), then back. Live, the link is the kernel-shaped
namespace (netns, shared by every PrfaaS worker): a thread changes its tbf rate at each point
of the schedule and reports the new capacity to the router (`POST /link`), as link telemetry
would; the controller's period and queue limit are scaled by the time scale. Simulated:
`run_policy` on the scaled scenario with the same schedule, workload and controller settings.
Figures per policy: KV offered to the link during the dip (what the policy intended: the KV
size of each request it sent to PrfaaS that arrived in the dip, over the dip's length), the
bytes the link actually carried during the dip (measured at the link: live, the host end's
receive counter of the shaped veth, sampled every SAMPLE_S, which counts TCP/IP headers and
the PrfaaS workers' small HTTP replies too; simulated, the shared link's own byte counter,
sim/link_trace.py), both also per BIN_S window over the run, P99 TTFT of the dip's arrivals,
P99 TTFT overall.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.runs import RunRecord, deployed, from_sim, live
from prfaas.scenario import load_scenario
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.netns import NetnsLink, netns_available
from prfaas.sim.link import LinkSchedule
from prfaas.sim.link_trace import LinkTrace
from prfaas.sim.policy_run import run_policy
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic

POLICIES = ("prfaas-threshold", "prfaas-threshold+controller")
# as benchmarks/bench_policies.py's simulated experiment: 4 PD-P + 4 PD-D at 2.8 req/s
RATE_RPS, N_P, N_D = 2.8, 4, 4
DIP_FACTOR = 10.0
SAMPLE_S = 0.25  # live seconds between link-counter samples (both sides)
BIN_S = 20.0  # scenario seconds per window of the carried / offered series


@dataclass(frozen=True)
class DipPlan:
    duration_s: float = 600.0
    dip_start_s: float = 200.0
    dip_end_s: float = 400.0


def _set_rate(link: NetnsLink, gbps: float) -> None:
    rate_kbit = max(int(gbps * 1e6), 8)
    burst = max(rate_kbit * 1000 // 8 // 100, 16 * 1514)
    subprocess.run(["ip", "netns", "exec", link.name, "tc", "qdisc", "change", "dev",
                    f"pfn{link.index}", "root", "tbf", "rate", f"{rate_kbit}kbit", "burst",
                    str(burst), "latency", "100ms"], check=True, capture_output=True, timeout=20)


def _tell_router(url: str, gbps: float) -> None:
    req = urllib.request.Request(f"{url}/link", json.dumps({"capacity_gbps": gbps}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10):
        pass


def _schedule_thread(dep: Deployment, points: list[tuple[float, float]], t0: float,
                     stop: threading.Event) -> threading.Thread:
    def run() -> None:
        for at_s, gbps in points:
            if stop.wait(max(t0 + at_s - time.perf_counter(), 0.0)):
                return
            assert dep.netns is not None
            _set_rate(dep.netns, gbps)
            _tell_router(dep.url, gbps)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _link_sampler(link: NetnsLink, t0: float, stop: threading.Event,
                  samples: list[tuple[float, float]]) -> threading.Thread:
    """Read the shaped link's delivered-bytes counter every SAMPLE_S (time from t0, bytes
    since the first sample)."""
    base = link.carried_bytes()

    def run() -> None:
        samples.append((time.perf_counter() - t0, 0.0))
        while not stop.wait(SAMPLE_S):
            samples.append((time.perf_counter() - t0, float(link.carried_bytes() - base)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _scen_gbps(bytes_: float, seconds_live: float, sc: Scales) -> float:
    """Live bytes over live seconds as scenario Gbps (x time scale / bytes scale)."""
    return round(bytes_ * 8 / seconds_live / 1e9 * sc.time / sc.bytes, 3)


def _carried(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """Bytes the link carried in [start, end) (live s), linear between samples."""
    ts, bs = np.array(samples).T
    return float(np.interp(end, ts, bs) - np.interp(start, ts, bs))


def _series(rec: RunRecord, samples: list[tuple[float, float]], kv_size: np.ndarray,
            sc: Scales, schedule: LinkSchedule, until_live_s: float) -> list[dict[str, float]]:
    """Per BIN_S window (scenario s): the link's capacity, KV offered (the policy's intent, by
    arrival) and bytes carried, in scenario Gbps."""
    a, width = sc.time, BIN_S * sc.time
    offered = rec.offered if rec.offered is not None else rec.remote
    out = []
    for lo in (float(x) for x in np.arange(0.0, until_live_s, width)):
        hi = lo + width
        sel = offered & (rec.arrival_s >= lo) & (rec.arrival_s < hi)
        out.append({"t_s": round(lo / a, 1),
                    "link_gbps": round(schedule.at(lo) * a / sc.bytes, 3),
                    "offered_gbps": _scen_gbps(float(kv_size[sel].sum()), width, sc),
                    "carried_gbps": _scen_gbps(_carried(samples, lo, hi), width, sc)})
    return out


def _figures(rec: RunRecord, start: float, end: float, sc: Scales, kv_size: np.ndarray,
             samples: list[tuple[float, float]]) -> dict[str, Any]:
    """In scenario units: KV offered to the link during the dip (Gbps: the KV size of each dip
    arrival the policy sent to PrfaaS, failed transfers included, over the dip's length), the
    bytes the link carried during the dip (Gbps, its counter), dip and overall P99 TTFT (s),
    the share of dip arrivals offloaded in the end."""
    ttft = rec.ready_s - rec.arrival_s
    dip = (rec.arrival_s >= start) & (rec.arrival_s < end)
    offered = rec.offered if rec.offered is not None else rec.remote
    return {"dip_offered_egress_gbps": _scen_gbps(float(kv_size[offered & dip].sum()),
                                                  end - start, sc),
            "dip_carried_gbps": _scen_gbps(_carried(samples, start, end), end - start, sc),
            "dip_ttft_p99_s": round(float(np.nanpercentile(ttft[dip], 99)) / sc.time, 3),
            "dip_offload_fraction": round(float(rec.remote[dip].mean()), 4),
            "dip_offered_fraction": round(float(offered[dip].mean()), 4),
            "ttft_p99_s": round(float(np.nanpercentile(ttft, 99)) / sc.time, 3),
            "completed": int(np.isfinite(rec.finish_s).sum()), "requests": int(ttft.size)}


def fluctuation_live(scales: Scales | None = None, plan: DipPlan | None = None,
                     tick: Callable[[str], None] = lambda _: None,
                     scenario: str = "link-fluctuation") -> dict[str, Any]:
    if not netns_available():
        raise ConfigError("link", "netns", "the live link-fluctuation run needs root, ip and tc "
                          "(a kernel-shaped link the PrfaaS workers share)")
    sc, dp = scales or Scales(), plan or DipPlan()
    s = load_scenario(scenario)
    a = sc.time
    rate = RATE_RPS
    n = int(rate * dp.duration_s)
    base = emulated_system(s, "prfaas_pd", sc, link_emulation="netns", n_p=N_P, n_d=N_D)
    lengths, out_tokens = base.scaled.scenario.lengths, base.scaled.scenario.output_tokens
    workload = synthetic(lengths, out_tokens, make_arrivals("poisson"), rate / a, n, seed=0)
    gbps = base.scaled.scenario.link_gbps
    points = [(dp.dip_start_s * a, gbps / DIP_FACTOR), (dp.dip_end_s * a, gbps)]
    schedule = LinkSchedule.piecewise([(0.0, gbps), *points])
    ctl = {"period_s": 5.0 * a, "queue_limit_s": 10.0 * a}
    out: dict[str, Any] = {"scenario": s.name, "scales": sc.to_json(),
                           "rate_rps": round(rate, 4), "requests": n, "plan": vars(dp),
                           "dip_gbps": s.link_gbps / DIP_FACTOR, "link_gbps": s.link_gbps,
                           "threshold_tokens_live": base.topology.policy_args.get(
                               "threshold_tokens"), "policies": {}}
    window = (dp.dip_start_s * a, dp.dip_end_s * a)
    kv_size = np.array([base.scaled.layout.size_bytes(int(n)) for n in workload.input_tokens],
                       dtype=float)
    for policy in POLICIES:
        args = {"controller": ctl} if policy.endswith("+controller") else {}
        es = emulated_system(s, "prfaas_pd", sc, link_emulation="netns", policy=policy,
                             policy_args=args, n_p=N_P, n_d=N_D)
        samples: list[tuple[float, float]] = []
        with deployed(es.topology) as dep:
            tick(f"{policy}: deployment up")
            stop = threading.Event()
            assert dep.netns is not None
            t0 = time.perf_counter()
            threads = [_link_sampler(dep.netns, t0, stop, samples),
                       _schedule_thread(dep, points, t0, stop)]
            try:
                rec = live(dep.url, f"emulated-{s.name}", workload,
                           [p.pid for p in dep.procs.values()], seed=3)
            finally:
                stop.set()
                for thread in threads:
                    thread.join(30)
        trace = LinkTrace(SAMPLE_S)
        sim, summary = run_policy(es.scaled.scenario, "prfaas_pd", policy, workload,
                                  threshold_tokens=es.sim_config.threshold_tokens,
                                  n_p=es.sim_config.n_p, n_d=es.sim_config.n_d, link=schedule,
                                  controller=ctl if args else None,
                                  kv_layers=es.scaled.layout.num_layers, plugins=[trace])
        srec = from_sim(sim, workload)
        until = dp.duration_s * a
        out["policies"][policy] = {"live": _figures(rec, *window, sc, kv_size, samples),
                                   "sim": _figures(srec, *window, sc, kv_size, trace.samples),
                                   "series": {
                                       "live": _series(rec, samples, kv_size, sc, schedule,
                                                       until),
                                       "sim": _series(srec, trace.samples, kv_size, sc,
                                                      schedule, until)},
                                   "cpu_share": round(rec.cpu_share or 0.0, 4),
                                   "loadavg_1m": rec.loadavg, "errors": rec.errors,
                                   "sim_threshold_history": summary.get("threshold_history")}
        tick(f"{policy}: done")
    return out
