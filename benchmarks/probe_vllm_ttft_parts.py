"""Where a vLLM request's TTFT goes, on an idle `topologies/vllm-local.yaml` deployment.

Starts the topology (free ports) with the connector's per-layer trace on
(PRFAAS_VLLM_TRACE_DIR), then, one request at a time:
- `direct`: a max_tokens=1 completion straight to each instance (what `prfaas profile` times);
- `routed`: streamed requests through the router on both routes, each split by the traces
  (one clock: CLOCK_MONOTONIC for every process) into: client send -> the producer's first
  attention-layer save (HTTP hops, vLLM admission, the first chunk's GDN layers) -> the
  producer's prefill end -> the decoder's KV complete -> the client's first token; plus the
  router's own time of the prefill call and each instance's CPU seconds (/proc, every thread).
Also each instance's CPU use while the deployment is idle. Writes JSON (default
benchmarks/results/vllm_ttft_parts.json). Run it under the heavy lock (~3 min).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _pid_tree(pid: int) -> list[int]:
    out = [pid]
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            ppid = int(Path(stat).read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out += _pid_tree(int(stat.split("/")[2]))
    return out


def _cpu_s(pids: list[int]) -> float:
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
            try:
                f = Path(stat).read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
    return total


async def _direct(s: aiohttp.ClientSession, url: str, ids: list[int]) -> float:
    t0 = time.perf_counter()
    async with s.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": ids,
                                                      "max_tokens": 1, "temperature": 0}) as r:
        await r.read()
    return time.perf_counter() - t0


async def _routed(s: aiohttp.ClientSession, url: str, ids: list[int]) -> dict[str, Any]:
    from prfaas.bench.loadgen import sse_payloads_async

    body = {"model": "tiny", "prompt": ids, "max_tokens": 16, "temperature": 0,
            "stream": True, "ignore_eos": True}
    t0, ttft, info = time.perf_counter(), None, {}
    async with s.post(f"{url}/v1/completions", json=body) as r:
        async for chunk in sse_payloads_async(r.content):
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            info = chunk.get("prfaas", info)
    return {"t0_mono": t0, "ttft": ttft, "e2e": time.perf_counter() - t0,
            "prfaas": {k: v for k, v in info.items() if k != "token_ids"}}


async def _measure(dep: Any, vocab: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, vocab, n)]

    urls = {w.name: f"http://{w.host}:{w.port}" for w in dep.topology.workers}
    pids = {w.name: _pid_tree(dep.pid(w.name)) for w in dep.topology.workers}
    out: dict[str, Any] = {"direct": [], "routed": []}
    async with aiohttp.ClientSession() as s:
        for url in urls.values():
            await _direct(s, url, ids(256))  # warm-up
        c0 = {w: _cpu_s(p) for w, p in pids.items()}
        time.sleep(3.0)
        out["idle_cpu_per_s"] = {w: round((_cpu_s(p) - c0[w]) / 3.0, 3) for w, p in pids.items()}
        for n in (256, 512, 1000, 2048):
            for w, url in urls.items():
                times = [await _direct(s, url, ids(n)) for _ in range(3)]
                out["direct"].append({"w": w, "n": n, "t": times})
        for n in (256, 512, 768, 1000, 1500, 2048):
            for _ in range(3):
                c0 = {w: _cpu_s(p) for w, p in pids.items()}
                rec = await _routed(s, dep.url, ids(n))
                rec.update(n=n, cpu={w: round(_cpu_s(p) - c0[w], 3) for w, p in pids.items()})
                out["routed"].append(rec)
                await asyncio.sleep(1.5)  # past vLLM's 1 s spin after a step
    return out


def summarize(d: dict[str, Any]) -> dict[str, Any]:
    events = sorted((e["t"], w, e) for w, evs in d["traces"].items() for e in evs)
    rows = []
    for r in d["routed"]:
        t0, end = r["t0_mono"], r["t0_mono"] + r["e2e"]
        route = r["prfaas"].get("route")
        pre = "prfaas-0" if route == "prfaas" else "pdp-0"
        mine = [(t, w, e) for t, w, e in events if t0 <= t <= end]
        saves = [t for t, w, e in mine if w == pre and e["ev"] == "layer"]
        ends = [t for t, w, e in mine if w == pre and e["ev"] == "prefill_end"]
        done = [e for t, w, e in mine if w == "pdd-0" and e["ev"] == "done"]
        if not (saves and ends and done and r["ttft"]):
            continue
        rows.append({"route": route, "input_tokens": r["n"], "ttft_s": r["ttft"],
                     "router_prefill_call_s": r["prfaas"].get("prefill_s"),
                     "send_to_first_layer_save_s": saves[0] - t0,
                     "first_save_to_prefill_end_s": ends[0] - saves[0],
                     "prefill_end_to_kv_done_s": done[0]["done"] - ends[0],
                     "kv_done_to_client_first_token_s": t0 + r["ttft"] - done[0]["done"],
                     "cpu_s": r["cpu"]})
    keys = [k for k in (rows[0] if rows else {}) if k.endswith("_s") and k != "cpu_s"]
    median = {rt: {k: round(statistics.median(x[k] for x in rows if x["route"] == rt), 4)
                   for k in keys} for rt in ("pd", "prfaas") if any(x["route"] == rt
                                                                    for x in rows)}
    direct: dict[str, dict[str, float]] = {}
    for x in d["direct"]:
        direct.setdefault(x["w"], {})[str(x["n"])] = round(statistics.median(x["t"]), 4)
    return {"median_by_route": median, "direct_median_s": direct,
            "idle_cpu_per_s": d["idle_cpu_per_s"], "rows": rows}


def main() -> None:
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live import free_ports
    from prfaas.serve.topology import load_topology

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/vllm_ttft_parts.json"))
    args = ap.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="prfaas-ttft-parts-"))
    os.environ["PRFAAS_VLLM_TRACE_DIR"] = str(trace)  # the workers inherit it
    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    facts = model_facts(topo)
    with deployed(free_ports(topo), trace / "logs") as dep:
        raw = asyncio.run(_measure(dep, facts.vocab_size, 7))
    raw["traces"] = {p.stem: [json.loads(x) for x in p.read_text().splitlines()]
                     for p in trace.glob("*.trace")}
    result = {"topology": topo.name, "loadavg_1m": os.getloadavg()[0], **summarize(raw)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median_by_route"], indent=1))


if __name__ == "__main__":
    main()
