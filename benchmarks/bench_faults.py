"""Live link faults, overload and a remote outage on the kernel-shaped (netns) link.

One deployment (1 PrfaaS in its namespace behind a tc-tbf veth + the delay stage, 1 PD-P,
2 PD-D; threshold t = 256) per section. Faults, each under steady load (a request every
1/RATE s, half of them long enough to be offloaded), with BEFORE_S of load before and
AFTER_S after: partition (10 s, the namespace end of the veth down), rate drop 10x for 20 s
(tc change), flapping 2 s down / 2 s up for 20 s, added RTT 30 ms for 20 s (user-space delay
stage: netem is missing). Per fault: sent / completed / lost, TTFT P50/P99 overall and during
the window, share of the window's requests prefilled locally. Overload: 5x the measured
capacity for OVERLOAD_S (429 + Retry-After, accepted = completed, router RSS growth). Remote
outage: the PrfaaS worker partitioned away for OUTAGE_S under steady load, TTFT and
throughput before / during / after, to set beside `prfaas simulate --outage prfaas@...`.
Writes benchmarks/results/faults.json (with the load average while measuring: the host is
shared, so compare within one run). Emulated nothing: the real tiny model runs on CPU.
Run: .venv/bin/python benchmarks/bench_faults.py [--quick]

`--rtt-control`: only the added-RTT fault, with the delay set to 0, 30 and 0 ms in turn on one
fresh deployment, into benchmarks/results/faults_rtt_control.json: whether the RTT row's spread
is the 30 ms or the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.bench.loadgen import Result, run_load
from prfaas.bench.workload import BenchRequest
from prfaas.serve.deploy.faults import Fault, FaultRunner, summarize
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import Topology, parse_topology

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks/results/faults.json"
OUT_RTT_CONTROL = ROOT / "benchmarks/results/faults_rtt_control.json"
RTT_CONTROL_MS = (0.0, 30.0, 0.0)
MODEL = "prfaas-tiny-kda"
RATE_GBPS = 0.05
RATE = 1.0  # requests per second
MAX_TOKENS = 8
BEFORE_S, AFTER_S = 10.0, 10.0
FAULTS = [Fault("partition", BEFORE_S, 10.0), Fault("rate-drop", BEFORE_S, 20.0, factor=10.0),
          Fault("flap", BEFORE_S, 20.0, period_s=2.0), Fault("rtt", BEFORE_S, 20.0, delay_ms=30)]
OVERLOAD_S = 60.0
OUTAGE = (20.0, 30.0, 20.0)  # before, during, after (s)


def topology() -> Topology:
    return parse_topology({
        "name": "bench-faults", "model": {"preset": "tiny", "threads": 1},
        "policy": {"name": "prfaas-threshold", "threshold_tokens": 256},
        "router": {"port": 0},
        "link": {"rate_gbps": RATE_GBPS, "connections": 2, "emulation": "netns",
                 "delay_stage": True},
        "timeouts": {"connect_s": 3, "prefill_s": 120, "kv_s": 60, "token_s": 60},
        "health": {"interval_s": 0.3, "timeout_s": 1.0, "failures_before_down": 2},
        "admission": {"max_inflight": 32, "max_queued_per_prefill": 6, "retry_after_s": 1},
        "max_retries": 3,
        "workers": [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
                    {"name": "pdd-0", "role": "pd-d"}, {"name": "pdd-1", "role": "pd-d"}]})


def requests(n: int, tag: str) -> list[BenchRequest]:
    """Distinct prompts per section; odd ones ~400 tokens (offloaded), even ones short."""
    return [BenchRequest(f"[{tag} {i}] " + ("Long prompt crossing the inter-DC link. " * 9
                                            if i % 2 else "short question?"), MAX_TOKENS)
            for i in range(n)]


def steady(dep: Deployment, seconds: float, tag: str, rate: float = RATE) -> list[Result]:
    arrivals = [i / rate for i in range(int(seconds * rate))]
    return asyncio.run(run_load(dep.url, MODEL, requests(len(arrivals), tag), arrivals, 300.0))


def wait_all_up(dep: Deployment) -> None:
    from urllib.request import urlopen

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with urlopen(f"{dep.url}/health", timeout=30) as resp:
            if all(m["up"] for m in json.load(resp)["members"].values()):
                return
        time.sleep(0.2)
    raise SystemExit("workers did not all come back up")


def run_fault(dep: Deployment, fault: Fault, after_s: float) -> dict[str, Any]:
    wait_all_up(dep)
    assert dep.netns is not None
    load = fault.start_s + fault.duration_s + after_s
    t0 = time.monotonic()
    runner = FaultRunner(dep.netns, fault, t0, dep.set_link_delay_ms).start()
    results = steady(dep, load, f"{fault.kind} {time.time()}")
    runner.join()
    return {"fault": {"kind": fault.kind, "duration_s": fault.duration_s,
                      "factor": fault.factor if fault.kind == "rate-drop" else None,
                      "period_s": fault.period_s if fault.kind == "flap" else None,
                      "delay_ms": fault.delay_ms if fault.kind == "rtt" else None},
            **summarize(results, runner.window)}


def phases(results: list[Result], bounds: tuple[float, float, float]) -> dict[str, Any]:
    """TTFT and throughput of the requests sent before / during / after the outage."""
    before, during, after = bounds
    cuts = {"before": (0.0, before), "during": (before, before + during),
            "after": (before + during, before + during + after)}
    out: dict[str, Any] = {}
    for name, (lo, hi) in cuts.items():
        sel = [r for r in results if lo <= r.sent_s < hi]
        ttft = [r.ttft_s for r in sel if r.ok and r.ttft_s is not None]
        out[name] = {"sent": len(sel), "lost": sum(not r.ok for r in sel),
                     "ttft_mean_s": float(np.mean(ttft)) if ttft else None,
                     "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else None,
                     "ttft_p90_s": float(np.percentile(ttft, 90)) if ttft else None,
                     "throughput_tokens_per_s": sum(r.output_tokens for r in sel if r.ok)
                     / (hi - lo),
                     "completions_per_s": sum(r.ok for r in sel) / (hi - lo),
                     "share_local": (sum(r.prfaas.get("route") == "pd" for r in sel if r.ok)
                                     / len(sel)) if sel else None}
    return out


def run_outage(dep: Deployment, bounds: tuple[float, float, float]) -> dict[str, Any]:
    wait_all_up(dep)
    assert dep.netns is not None
    before, during, after = bounds
    t0 = time.monotonic()
    runner = FaultRunner(dep.netns, Fault("partition", before, during), t0).start()
    results = steady(dep, before + during + after, f"outage {time.time()}")
    runner.join()
    return {"what": "prfaas-0 partitioned away (the whole PrfaaS cluster of 1 worker)",
            "before_s": before, "during_s": during, "after_s": after,
            "window_s": list(runner.window), "phases": phases(results, bounds)}


def run_overload(dep: Deployment, seconds: float) -> dict[str, Any]:
    wait_all_up(dep)
    t0 = time.monotonic()
    calib = steady(dep, 10.0, f"cal {time.time()}", rate=4.0)
    capacity = sum(r.ok for r in calib) / max(time.monotonic() - t0, 1e-9)
    rss0 = _rss(dep.pid("router"))
    rate = 5 * capacity
    results = steady(dep, seconds, f"over {time.time()}", rate=rate)
    ok = [r for r in results if r.ok]
    shed = [r for r in results if r.status == 429]
    return {"capacity_req_per_s": capacity, "offered_req_per_s": rate, "seconds": seconds,
            "sent": len(results), "completed": len(ok), "shed_429": len(shed),
            "other_failures": len(results) - len(ok) - len(shed),
            "retry_after": sorted({r.retry_after for r in shed if r.retry_after}),
            "accepted_incomplete": sum(r.output_tokens != MAX_TOKENS for r in ok),
            "router_rss_growth_mb": (_rss(dep.pid("router")) - rss0) / 2**20,
            "worker_restarts": dep.restarts, "all_alive": all(dep.alive().values())}


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rtt_control() -> None:
    """The RTT fault with 0, 30 and 0 ms of added delay in turn, one fresh deployment."""
    load0 = os.getloadavg()
    topo = topology()
    with Deployment(topo) as dep:
        runs = [run_fault(dep, Fault("rtt", BEFORE_S, 20.0, delay_ms=ms), AFTER_S)
                for ms in RTT_CONTROL_MS]
    out = {"what": "the rtt fault of faults.json with delay_ms 0, 30, 0 in turn",
           "runs": runs, "host": {"cpus": os.cpu_count(), "loadavg_start": load0,
                                  "loadavg_end": os.getloadavg()},
           "topology": topo.to_dict()}
    OUT_RTT_CONTROL.write_text(json.dumps(out, indent=1) + "\n")
    for r in runs:
        print(f"{r['fault']['delay_ms']:>4} ms: completed {r['completed']} shed {r['shed']} "
              f"lost {r['lost']} TTFT P50/P99 {r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f} s")
    print(f"wrote {OUT_RTT_CONTROL}")


def main(quick: bool = False, rtt_control_only: bool = False) -> None:
    if rtt_control_only:
        rtt_control()
        return
    scale = 0.3 if quick else 1.0
    faults = [Fault(f.kind, f.start_s * scale, f.duration_s * scale, f.factor,
                    max(f.period_s * scale, 1.0), f.delay_ms) for f in FAULTS]
    load0 = os.getloadavg()
    topo = topology()
    with Deployment(topo) as dep:
        results = {"faults": [run_fault(dep, f, AFTER_S * scale) for f in faults]}
        results["outage"] = run_outage(dep, tuple(x * scale for x in OUTAGE))  # type: ignore[arg-type]
        results["overload"] = run_overload(dep, OVERLOAD_S * scale)
    results["host"] = {"cpus": os.cpu_count(), "loadavg_start": load0,
                       "loadavg_end": os.getloadavg(), "quick": quick}
    results["topology"] = topo.to_dict()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    for f in results["faults"]:
        d = f["during"]
        print(f"{f['fault']['kind']:<10} sent {f['sent']:>3} lost {f['lost']} "
              f"TTFT P50/P99 {f['ttft_p50_s']:.2f}/{f['ttft_p99_s']:.2f} s; during: "
              f"P50 {d['ttft_p50_s']} local {d['share_local']}")
    print(json.dumps(results["outage"]["phases"], indent=1))
    print(json.dumps(results["overload"], indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every duration x 0.3")
    parser.add_argument("--rtt-control", action="store_true",
                        help="only the RTT control (faults_rtt_control.json)")
    args = parser.parse_args()
    main(quick=args.quick, rtt_control_only=args.rtt_control)
