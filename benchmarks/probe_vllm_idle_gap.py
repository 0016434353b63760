"""Does an idle gap before a request slow its prefill on the vLLM deployment?

Why: in sim-vs-live on `topologies/vllm-local.yaml` the router's prefill calls took ~1.6-2x
the profile's T(l) at the lower load (0.66 req/s) and ~1.2-1.4x at the higher one (1.32
req/s), where more prefills overlap; the profile times its calls back to back. A busy decoder
did not explain it (probe_vllm_busy_decoder.py). This probe starts the topology (free ports)
and sends lone requests (PD route: 600 and 900 tokens; PrfaaS route: 2000; 2 output tokens),
each after an idle gap of 0.05 / 0.5 / 1.5 / 3 s, gaps and lengths interleaved, ROUNDS rounds.
Per request: the router's own time of its prefill call (`prefill_s`, the reply's `prfaas`
object) and the client's TTFT. Writes JSON (default benchmarks/results/vllm_idle_gap.json).
Run it under the heavy lock (~3 min).
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
LENGTHS = (600, 900, 2000)
GAPS_S = (0.05, 0.5, 1.5, 3.0)
ROUNDS = 4


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

    def req(n: int) -> BenchRequest:
        return BenchRequest([int(t) for t in rng.integers(3, vocab, n)], 2)

    rows: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    with deployed(free_ports(topo)) as dep:
        url, model = dep.url, served_model(dep.url)
        asyncio.run(run_load(url, model, [req(300)], [0.0]))  # warm-up
        time.sleep(2.0)
        for _ in range(args.rounds):
            for gap in GAPS_S:
                for n in LENGTHS:
                    time.sleep(gap)
                    r = asyncio.run(run_load(url, model, [req(n)], [0.0]))[0]
                    if not r.ok:
                        raise RuntimeError(f"gap {gap} {n}: {r.error}")
                    rows.append({"gap_s": gap, "input_tokens": n,
                                 "route": r.prfaas.get("route"),
                                 "prefill_s": round(float(r.prfaas["prefill_s"]), 4),
                                 "ttft_s": round(float(r.ttft_s or 0.0), 4)})
    load.append(os.getloadavg()[0])
    median = {str(g): {str(n): statistics.median(r["prefill_s"] for r in rows
                                                 if r["gap_s"] == g and r["input_tokens"] == n)
                       for n in LENGTHS} for g in GAPS_S}
    ttft = {str(g): {str(n): statistics.median(r["ttft_s"] for r in rows
                                               if r["gap_s"] == g and r["input_tokens"] == n)
                     for n in LENGTHS} for g in GAPS_S}
    doc = {"topology": topo.name, "lengths": list(LENGTHS), "gaps_s": list(GAPS_S),
           "rounds": args.rounds, "median_prefill_s": median, "median_ttft_s": ttft,
           "loadavg_1m_before_after": [round(x, 2) for x in load], "rows": rows,
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("median_prefill_s", "median_ttft_s")}, indent=1))


if __name__ == "__main__":
    main()
