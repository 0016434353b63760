"""Where a lone request's TTFT goes on an idle native `topologies/local.yaml` deployment, and
how the engine profile's T_prefill(l) compares with the PrfaaS worker's own prefill.

Why: sim-vs-live's idle route overhead for the PrfaaS route came out negative (-307 ms in
sim_vs_live_native_rerun_before.json): lone offloaded requests finished their first token sooner
than the simulator predicts from the profile. This probe splits each lone request, one at a
time, into the parts the simulator models:
- `prefill_s`: the worker's engine prefill (the reply's `prefill_s`), against the profile's
  way of timing the same length here, in this process (`profile_style_s`: `engine.prefill`
  from scratch, the profiler's code path), interleaved with the live requests so a slow
  moment of the host falls on both;
- `transfer_tail_s`: prefill end -> last KV frame acknowledged (the simulator: the last
  layer's bytes at the link rate, the rest overlapped with the prefill);
- `kv_ready_s`: client send -> the decoder held the KV (wall clock, one host);
- `ttft_s`: client send -> first streamed token.
Also the profile itself measured the way `sim-vs-live` measures it (`run_profile(reps=2)`,
engine_facts._native_profile) before and after, to show its spread on this host.
Writes JSON (default benchmarks/results/native_idle_parts.json). Run it under the heavy lock
(~3 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (512, 1024, 2048, 4096)
PAUSE_S = 1.5  # as experiments/idle_routes.py


def _profile_points(engine: Any) -> list[list[float]]:
    from prfaas.engine.profiler import measure_prefill

    times, _ = measure_prefill(engine, LENGTHS, 2)
    return [[n, round(t, 4)] for n, t in times]


def _lone(url: str, model: str, ids: list[int]) -> dict[str, Any]:
    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest

    res = asyncio.run(run_load(url, model, [BenchRequest(ids, 4)], [0.0], timeout_s=300.0))[0]
    p = res.prfaas
    ready = p.get("kv_ready_unix_s")
    return {"route": p.get("first_route") or p.get("route"), "ok": res.ok,
            "ttft_s": res.ttft_s, "prefill_s": p.get("prefill_s"),
            "queue_s": p.get("prefill_queue_s"), "transfer_tail_s": p.get("transfer_tail_s"),
            "kv_bytes": p.get("kv_bytes"),
            "kv_ready_s": None if ready is None else round(ready - res.sent_unix_s, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/native_idle_parts.json"))
    args = ap.parse_args()

    from prfaas.engine.engine import Engine
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live.live import free_ports, served_model
    from prfaas.serve.native import engine_config
    from prfaas.serve.topology import load_topology

    topology = load_topology(str(ROOT / "topologies/local.yaml"))
    engine = Engine(engine_config(topology.model))
    load0 = os.getloadavg()[0]
    profile_before = _profile_points(engine)
    rng = np.random.default_rng(7)
    rows: list[dict[str, Any]] = []
    with deployed(free_ports(topology)) as dep:
        model = served_model(dep.url)
        _lone(dep.url, model, [int(t) for t in rng.integers(3, engine.config.vocab_size, 256)])
        for rep in range(args.reps):
            for n in LENGTHS:
                ids = [int(t) for t in rng.integers(3, engine.config.vocab_size, n)]
                t0 = time.perf_counter()
                engine.prefill(ids)
                here = time.perf_counter() - t0
                time.sleep(PAUSE_S)
                rows.append({"rep": rep, "length_tokens": n,
                             "profile_style_s": round(here, 4), **_lone(dep.url, model, ids)})
                print(rows[-1], flush=True)
                time.sleep(PAUSE_S)
    profile_after = _profile_points(engine)
    summary = {}
    for n in LENGTHS:
        mine = [r for r in rows if r["length_tokens"] == n and r["ok"]]
        summary[str(n)] = {
            "route": sorted({str(r["route"]) for r in mine}),
            "median_profile_style_s": round(statistics.median(r["profile_style_s"]
                                                              for r in mine), 4),
            **{f"median_{k}": round(statistics.median(float(r[k]) for r in mine), 4)
               for k in ("prefill_s", "transfer_tail_s", "kv_ready_s", "ttft_s")}}
    out = {"how": (__doc__ or "").strip(), "topology": "topologies/local.yaml",
           "link_gbps": topology.link.rate_gbps, "lengths": list(LENGTHS), "reps": args.reps,
           "profile_reps2_before": profile_before, "profile_reps2_after": profile_after,
           "loadavg_1m_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "rows": rows, "summary": summary}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
