"""Does a busy decoder slow the prefill calls of an idle-ish vLLM deployment?

Why: in sim-vs-live on `topologies/vllm-local.yaml` the router's prefill calls took ~2x the
profile's T(l) at the lower load, where prefills rarely overlap, while core 1 (the decoder)
was nearly full and core 0 (both prefill instances) mostly idle (docs/sim-vs-live.md). This
probe starts the topology (free ports) and sends lone requests (PD route: 600 and 900 tokens;
PrfaaS route: 2000; 2 output tokens), three rounds, lengths interleaved: first with nothing
else running (`idle`), then the same while three 400-token decode streams keep the decoder busy
(`busy`). Per request: the router's own time of its prefill call (`prefill_s`, the reply's
`prfaas` object) and the client's TTFT. Writes JSON (default
benchmarks/results/vllm_busy_decoder.json). Run it under the heavy lock (~2 min).
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
ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/vllm_busy_decoder.json"))
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
    rng = np.random.default_rng(3)

    def req(n: int, out: int) -> BenchRequest:
        return BenchRequest([int(t) for t in rng.integers(3, vocab, n)], out)

    rows: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    with deployed(free_ports(topo)) as dep:
        url, model = dep.url, served_model(dep.url)
        asyncio.run(run_load(url, model, [req(300, 2)], [0.0]))  # warm-up

        def probe(phase: str) -> None:
            for _ in range(ROUNDS):
                for n in LENGTHS:
                    r = asyncio.run(run_load(url, model, [req(n, 2)], [0.0]))[0]
                    if not r.ok:
                        raise RuntimeError(f"{phase} {n}: {r.error}")
                    rows.append({"phase": phase, "input_tokens": n,
                                 "route": r.prfaas.get("route"),
                                 "prefill_s": round(float(r.prfaas["prefill_s"]), 4),
                                 "ttft_s": round(float(r.ttft_s or 0.0), 4)})
                    time.sleep(0.4)

        probe("idle")

        async def busy() -> None:
            longs = [req(200, 400) for _ in range(3)]
            task = asyncio.create_task(run_load(url, model, longs, [0.0, 0.1, 0.2],
                                                timeout_s=600.0))
            await asyncio.sleep(2.0)  # the three streams decoding
            await asyncio.to_thread(probe, "busy")
            done = await task
            if not all(r.ok for r in done):
                raise RuntimeError("a decode stream failed")

        asyncio.run(busy())
    load.append(os.getloadavg()[0])
    median = {phase: {str(n): statistics.median(r["prefill_s"] for r in rows
                                                if r["phase"] == phase and r["input_tokens"] == n)
                      for n in LENGTHS} for phase in ("idle", "busy")}
    doc = {"topology": topo.name, "lengths": list(LENGTHS), "rounds": ROUNDS,
           "median_prefill_s": median,
           "busy_over_idle": {str(n): round(median["busy"][str(n)] / median["idle"][str(n)], 3)
                              for n in LENGTHS},
           "loadavg_1m_before_after": [round(x, 2) for x in load], "rows": rows,
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("median_prefill_s", "busy_over_idle")}))


if __name__ == "__main__":
    main()
