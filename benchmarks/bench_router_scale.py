"""The live router's routing decision in front of many workers: time per request.

Run: python benchmarks/bench_router_scale.py [--workers 1000] [--baseline-src SRC]
  -> benchmarks/results/router_scale.json
Fake workers (no processes) registered in the live router's bookkeeping (`LiveCluster`, the
ClusterView the policy reads) in the 10K datacenter's mix (417 PrfaaS : 373 PD-P : 460 PD-D),
a fake clock, Poisson arrivals at 90% of the prefill capacity and lognormal prompts (the case
study's). Each request's decision (`cluster.view()` + `policy.route`) is timed alone; then the
bookkeeping is told what the router would tell it (prefill and decode started, finished when
predicted), so loads are those of a busy cluster. `decisions_sha256` is a digest of every
decision: the same with `--baseline-src` (another tree's src, run in a subprocess beside
this one) means the same routes. Policies: prfaas-threshold, and cache-aware with a prefix
cached on a few random workers.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "results" / "router_scale.json"
REQUESTS = 4000


def _live_cluster(topo: Any, clock: list[float]) -> Any:
    """A LiveCluster on the fake clock, in either serve layout (flat serve/, before the
    router/worker/deploy split, or serve/router/), so one script times both trees."""
    try:
        from prfaas.serve.engines import engine_backend
        from prfaas.serve.router.cluster import LiveCluster
        geometry = engine_backend(topo).card().kv
    except ImportError:
        from prfaas.serve.cluster import LiveCluster  # type: ignore[no-redef]
        from prfaas.serve.model import engine_config, kv_geometry
        geometry = kv_geometry(topo.model, engine_config(topo.model))
    return LiveCluster(topo, geometry, clock=lambda: clock[0])


def run(workers: int, policy_name: str, requests: int, seed: int = 0) -> dict[str, Any]:
    from prfaas.core.types import RequestInfo, RouteQuery
    from prfaas.policy.base import make_router
    from prfaas.serve.topology import WorkerSpec, load_topology

    base = load_topology()
    n_prf = round(workers * 417 / 1250)
    n_p = round(workers * 373 / 1250)
    specs = ([WorkerSpec(f"prfaas-{i}", "prfaas") for i in range(n_prf)]
             + [WorkerSpec(f"pdp-{i}", "pd-p") for i in range(n_p)]
             + [WorkerSpec(f"pdd-{i}", "pd-d", max_batch=20)
                for i in range(workers - n_prf - n_p)])
    topo = replace(base, workers=tuple(specs))
    clock = [1000.0]
    cluster = _live_cluster(topo, clock)
    policy = make_router(policy_name, threshold_tokens=20000)
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(9.9, 1.0, requests), 128, 131072).astype(int)
    mean_s = float(np.mean(lengths)) * 2e-4  # the cluster's prior seconds per token
    gaps = rng.exponential(mean_s / (0.9 * (n_prf + n_p)), requests)
    names = [w.name for w in specs if w.role != "pd-d"]
    done: list[tuple[float, int, str, float]] = []  # (at, seq, worker, work_s)
    digest = hashlib.sha256()
    times: list[float] = []
    for k in range(requests):
        clock[0] += float(gaps[k])
        while done and done[0][0] <= clock[0]:
            at, _, name, work = heapq.heappop(done)
            now, clock[0] = clock[0], at
            cluster.finish(name, work)
            clock[0] = now
        total = int(lengths[k])
        held = {} if policy_name == "prfaas-threshold" else {
            str(names[int(i)]): int(total * 0.5) for i in rng.integers(0, len(names), 3)}
        start = time.perf_counter()
        view = cluster.view()
        query = RouteQuery(RequestInfo(str(k), total, 64, view.now_s), held)
        decision = policy.route(query, view)
        times.append(time.perf_counter() - start)
        digest.update(f"{decision.prefill_instance},{decision.decode_instance};".encode())
        pre, dec = decision.prefill_instance, decision.decode_instance
        if not pre or dec is None:
            continue
        work = cluster.prefill_time_s(pre, total, decision.cached_tokens)
        cluster.start(pre, work)
        cluster.start(dec)
        heapq.heappush(done, (cluster.loads[pre].busy_until, 2 * k, pre, work))
        heapq.heappush(done, (clock[0] + work + 64 * 0.025, 2 * k + 1, dec, 0.0))
    us = sorted(t * 1e6 for t in times)
    return {"workers": workers, "policy": policy_name, "requests": requests,
            "mean_us": round(statistics.fmean(us), 1),
            "p50_us": round(us[len(us) // 2], 1), "p99_us": round(us[int(len(us) * 0.99)], 1),
            "decisions_sha256": digest.hexdigest()}


def measure(workers: int) -> list[dict[str, Any]]:
    return [run(workers, p, REQUESTS) for p in ("prfaas-threshold", "cache-aware")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[12, 100, 1000])
    ap.add_argument("--baseline-src", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps([row for w in args.workers for row in measure(w)]))
        return
    trees = {"after": Path(__file__).resolve().parent.parent / "src"}
    if args.baseline_src is not None:
        trees["before"] = args.baseline_src
    result: dict[str, Any] = {
        "how": __doc__.split("\n\n", 1)[1].strip().replace("\n", " "),
        "machine": f"{platform.processor() or platform.machine()}, python "
                   f"{platform.python_version()}, shared 2-core VM (timing runs held "
                   "/work/heavy.lock; others' work ran beside it)"}
    for tree, src in trees.items():
        env = {**os.environ, "PYTHONPATH": str(src)}
        done = subprocess.run([sys.executable, __file__, "--child", "--workers",
                               *map(str, args.workers)], env=env, capture_output=True,
                              text=True, check=True, timeout=3600)
        result[tree] = {"source": str(src), "rows": json.loads(done.stdout)}
        print(tree, json.dumps(result[tree], indent=1), flush=True)
    if "before" in result:
        result["same_decisions"] = all(
            a["decisions_sha256"] == b["decisions_sha256"]
            for a, b in zip(result["after"]["rows"], result["before"]["rows"], strict=True))
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
