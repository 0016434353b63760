"""Live serving benchmark: the embedded local topology under a scaled Mooncake trace.

Starts router + PrfaaS prefill + PD-P + PD-D on free ports (one process each, torch threads 1),
replays the Mooncake conversation trace (lengths x LENGTH_SCALE, Poisson arrivals at RATE for
DURATION_S, trace rows in order) once per policy, and writes TTFT / TPOT / throughput, routes,
KV bytes and the router's own time per request (vs end to end) to
benchmarks/results/serve.json. Both policies run on the same machine in one invocation, so
compare them as ratios; absolute times depend on the (shared, 2-core) CPU.
Run: .venv/bin/python benchmarks/bench_serve.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from prfaas.bench.loadgen import run_load
from prfaas.bench.report import render, summarize
from prfaas.bench.workload import Scaling, poisson_arrivals, read_mooncake
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
TRACES = [ROOT / "src/prfaas/data/traces/mooncake_conversation_trace.jsonl",
          Path("/work/shared/data/traces/mooncake_conversation_trace.jsonl")]
LENGTH_SCALE = 0.1
MAX_OUTPUT_TOKENS = 32
RATE = 0.3
DURATION_S = 60.0
POLICIES = ("prfaas-threshold", "all-pd")


def _trace() -> Path:
    for path in TRACES:
        if path.is_file():
            return path
    raise SystemExit(f"no Mooncake trace at {[str(p) for p in TRACES]}")


def run_policy(policy: str, duration_s: float) -> dict[str, Any]:
    topo = load_topology()
    topo = replace(topo, policy=policy, router_port=0,
                   workers=tuple(replace(w, port=0, kv_port=0) for w in topo.workers))
    scaling = Scaling(LENGTH_SCALE, MAX_OUTPUT_TOKENS, seed=0)
    arrivals = poisson_arrivals(RATE, duration_s, seed=0)
    requests = read_mooncake(_trace(), scaling, limit=len(arrivals))
    with Deployment(topo) as dep:
        model = "prfaas-tiny-kda"
        t0 = time.perf_counter()
        results = asyncio.run(run_load(dep.url, model, requests, arrivals, 300.0))
        wall_s = time.perf_counter() - t0
    summary = summarize(results, wall_s)
    print(f"--- {policy}\n{render(summary)}", flush=True)
    return summary


def main(quick: bool = False) -> int:
    duration_s = 20.0 if quick else DURATION_S
    topo = load_topology()
    runs = {policy: run_policy(policy, duration_s) for policy in POLICIES}
    base, ours = runs["all-pd"], runs["prfaas-threshold"]
    payload = {
        "how": (f"benchmarks/bench_serve.py: embedded topologies/local.yaml (threshold "
                f"{topo.policy_args.get('threshold_tokens')} tokens, inter-DC link "
                f"{topo.link.rate_gbps} Gbps x {topo.link.connections} connections, 1 PrfaaS "
                f"prefill + 1 PD-P + 1 PD-D, torch threads 1 each) on one host; Mooncake "
                f"conversation trace rows in order, lengths x {LENGTH_SCALE} (outputs capped at "
                f"{MAX_OUTPUT_TOKENS}), Poisson arrivals {RATE} req/s for {duration_s:.0f} s "
                f"(seed 0), streaming completions, greedy, ignore_eos. TTFT/TPOT/e2e timed by "
                f"the client; router overhead = router CPU time per request (parse, tokenize, "
                f"hash, route, format; waits on workers excluded). "
                f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
                f"{platform.processor() or platform.machine()}."),
        "trace": str(_trace()),
        "runs": runs,
        "ratios_prfaas_vs_all_pd": {
            "ttft_mean": _ratio(ours["ttft_s"]["mean"], base["ttft_s"]["mean"]),
            "ttft_p90": _ratio(ours["ttft_s"]["p90"], base["ttft_s"]["p90"]),
            "tpot_mean": _ratio(ours["tpot_s"]["mean"], base["tpot_s"]["mean"]),
        },
    }
    out = ROOT / "benchmarks/results/serve.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, sort_keys=True))
    print(f"wrote {out}")
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 s per policy")
    sys.exit(main(quick=parser.parse_args().quick))
