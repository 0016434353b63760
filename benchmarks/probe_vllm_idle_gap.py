"""Is a lone prefill on the vLLM deployment slower after an idle gap, and how much of the
router's prefill call is the instance itself?

Why: in sim-vs-live on `topologies/vllm-local.yaml` the router's prefill calls took ~1.6-2x
the profile's T(l) at the lower load (0.66 req/s) and ~1.2-1.4x at the higher one (1.32
req/s); the profile (a standalone instance, no connector) times its calls back to back, and a
vLLM reader sleeps on a zmq poll once its idle spin (10 ms here) has passed. A busy decoder
did not explain it (probe_vllm_busy_decoder.py). This probe starts the topology (free ports)
and, lengths and gaps interleaved, ROUNDS rounds, sends each length after an idle gap of 0 /
0.05 / 0.5 / 1.5 s twice: once straight to the deployed pd-p instance (`direct`: a
max_tokens=1 completion, as `prfaas profile` times it: client wall time) and once through the
router (`router`: 2 output tokens; the router's own time of its prefill call, `prefill_s` in
the reply's `prfaas` object, and the client's TTFT). PD route: 600 and 1000 tokens; PrfaaS
route (router only): 2000. Writes JSON (default benchmarks/results/vllm_idle_gap.json). Run
it under the heavy lock (~4 min).
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
PD_LENGTHS = (600, 1000)
PRFAAS_LENGTH = 2000
GAPS_S = (0.0, 0.05, 0.5, 1.5)
ROUNDS = 4


def _direct_s(url: str, body: dict[str, Any]) -> float:
    """Client wall time of one completion straight to an instance (as `prfaas profile`)."""
    from prfaas.integrations.vllm.reference import post_completion

    t0 = time.perf_counter()
    status, reply = post_completion(url, body, 300.0)
    if status != 200:
        raise RuntimeError(f"direct call to {url}: {status} {reply}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/vllm_idle_gap.json"))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live import free_ports, served_model
    from prfaas.serve.topology import load_topology

    topo = load_topology(ROOT / "topologies/vllm-local.yaml")
    vocab = model_facts(topo).vocab_size
    rng = np.random.default_rng(5)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, vocab, n)]

    rows: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    with deployed(free_ports(topo)) as dep:
        url, model = dep.url, served_model(dep.url)
        pdp = dep.topology.by_role("pd-p")[0].url
        asyncio.run(run_load(url, model, [BenchRequest(ids(300), 2)], [0.0]))  # warm-up
        _direct_s(pdp, {"model": model, "prompt": ids(300), "max_tokens": 1, "temperature": 0})
        for _ in range(args.rounds):
            for gap in GAPS_S:
                for n in (*PD_LENGTHS, PRFAAS_LENGTH):
                    if n in PD_LENGTHS:
                        time.sleep(gap)
                        wall = _direct_s(pdp, {"model": model, "prompt": ids(n),
                                               "max_tokens": 1, "temperature": 0})
                        rows.append({"path": "direct", "gap_s": gap, "input_tokens": n,
                                     "prefill_s": round(wall, 4)})
                    time.sleep(gap)
                    r = asyncio.run(run_load(url, model, [BenchRequest(ids(n), 2)], [0.0]))[0]
                    if not r.ok:
                        raise RuntimeError(f"gap {gap} {n}: {r.error}")
                    rows.append({"path": "router", "gap_s": gap, "input_tokens": n,
                                 "route": r.prfaas.get("route"),
                                 "prefill_s": round(float(r.prfaas["prefill_s"]), 4),
                                 "ttft_s": round(float(r.ttft_s or 0.0), 4)})
    load.append(os.getloadavg()[0])

    def med(path: str, gap: float, n: int) -> float:
        return round(statistics.median(r["prefill_s"] for r in rows if r["path"] == path
                                       and r["gap_s"] == gap and r["input_tokens"] == n), 4)

    median = {path: {str(g): {str(n): med(path, g, n) for n in lengths} for g in GAPS_S}
              for path, lengths in (("direct", PD_LENGTHS),
                                    ("router", (*PD_LENGTHS, PRFAAS_LENGTH)))}
    router_over_direct = {str(n): round(statistics.median(
        median["router"][str(g)][str(n)] / median["direct"][str(g)][str(n)] for g in GAPS_S), 3)
        for n in PD_LENGTHS}
    doc = {"topology": topo.name, "pd_lengths": list(PD_LENGTHS),
           "prfaas_length": PRFAAS_LENGTH, "gaps_s": list(GAPS_S), "rounds": args.rounds,
           "median_prefill_s": median, "router_over_direct": router_over_direct,
           "loadavg_1m_before_after": [round(x, 2) for x in load], "rows": rows,
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("median_prefill_s", "router_over_direct")}, indent=1))


if __name__ == "__main__":
    main()
