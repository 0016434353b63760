"""Each route's fixed cost, measured on an idle deployment (part of a topology's profile).

The engine profile times one instance alone (T_prefill(l), S_kv(l), decode steps); a request
through the deployment pays more than that: the client -> router -> decode/prefill HTTP hops,
the connector's work in the prefill, the decoder's notice of its KV and its first step, the
stream back. `measure` sends requests one at a time (the previous one finished: no queue, an
idle link) through the topology's router at the profile's lengths and records each one's
client TTFT and the route the policy chose: the profile's `idle_ttft` points.

`route_overheads` turns them into one fixed overhead per route: the median, over that route's
points, of the idle TTFT minus what the simulator predicts for the same lone request from the
engine profile (the simulator itself computes that side: sim_vs_live/calibration.py, which
also reads each point's `prefill_s` and counted KV bytes). Nothing here looks at a loaded run.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.serve.cores import pinned_thread

HOW = ("client TTFT of single requests (fresh random token-id prompts, streaming, greedy, "
       "4 output tokens, ignore_eos) through the topology's router, one at a time with the "
       "deployment otherwise idle, after one unmeasured round of the lengths (warm-up); "
       "route = the policy's first choice; prefill_s = the router's account of the prefill, "
       "kv_bytes / kv_wire_bytes = the KV bytes the connector counted (tensor / on the wire)")
OUTPUT_TOKENS = 4
# after each request, so the next one finds every instance idle: longer than the 1 s a vLLM
# Worker keeps spinning on its step queue after its last step (shm_broadcast.SpinCondition),
# which on a shared core takes CPU from the instance beside it
PAUSE_S = 1.5
# rounds over the lengths: a route's overhead is the median of its points, and on this 2-core
# host one point moves by tens of ms (3 rounds gave the local route 26, 49 and 40 ms in three
# runs the same afternoon, docs/sim-vs-live.md)
REPS = 5


def measure(topology: Any, lengths: list[int], log_dir: str | Path, reps: int = REPS,
            seed: int = 11) -> dict[str, Any]:
    """Start the topology (free ports), measure, stop it: the profile's `idle_ttft` section."""
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live.live import free_ports, served_model

    facts = model_facts(topology)
    usable = usable_lengths(lengths, facts.max_context_tokens, facts.block_size_tokens)
    with (deployed(free_ports(topology), Path(log_dir) / "idle-routes") as dep,
          pinned_thread(topology.router_cores, "router.cores")):  # the client: as sim-vs-live's
        points = measure_on(dep.url, served_model(dep.url), usable, facts.vocab_size, reps,
                            seed)
    return {"how": HOW, "points": points}


def usable_lengths(lengths: list[int], max_context_tokens: int, block_tokens: int = 1
                   ) -> list[int]:
    """The lengths a lone request can have with its output tokens in the model's context,
    each (when longer than a cache block) half a block short of the given one: a prompt of a
    whole number of blocks is the connector's special case (the native worker then ships no
    partial block's state snapshot, vLLM's last block is full), and a workload's prompts are
    not, so the bytes the idle points count are those of a typical prompt."""
    half = block_tokens // 2
    return [n - half if n > block_tokens else n for n in lengths
            if n - half < max_context_tokens - OUTPUT_TOKENS - 1]


def lone_request(url: str, model: str, length: int, output_tokens: int, vocab_size: int,
                 rng: np.random.Generator, timeout_s: float = 300.0) -> Any:
    """One request of a fresh random token-id prompt, alone: its loadgen `Result`."""
    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest

    req = BenchRequest([int(t) for t in rng.integers(3, vocab_size, int(length))], output_tokens)
    return asyncio.run(run_load(url, model, [req], [0.0], timeout_s=timeout_s))[0]


def warm_up(url: str, model: str, lengths: list[int], output_tokens: int, vocab_size: int,
            seed: int) -> list[dict[str, Any]]:
    """Unmeasured requests, one at a time, then a pause; their outcome, for the record only.

    A freshly started deployment's first requests pay one-time costs the simulator (a steady
    state) has no term for: measured, the first local and the first offloaded request of
    sim-vs-live's first load took 2.2-4.7x the profile's T(l) in their prefill call, the same
    prompts in the next load 0.8-1.5x (docs/sim-vs-live.md). The profile's own instance is
    warmed before it is timed too (integrations/vllm/profile.py)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        res = lone_request(url, model, n, output_tokens, vocab_size, rng, timeout_s=900.0)
        out.append({"length_tokens": int(n), "ok": bool(res.ok), "route": res.first_route,
                    "ttft_s": _num(res.ttft_s), "prefill_s": _num(res.prfaas.get("prefill_s"))})
    time.sleep(PAUSE_S)  # every instance idle again before what follows
    return out


def measure_on(url: str, model: str, lengths: list[int], vocab_size: int, reps: int,
               seed: int, warm: bool = True) -> list[dict[str, Any]]:
    """`reps` rounds of lone requests at `lengths` (after one unmeasured round unless `warm`
    is False: the caller has just warmed the deployment)."""
    if warm:
        warm_up(url, model, lengths, OUTPUT_TOKENS, vocab_size, seed - 1)
    rng = np.random.default_rng(seed)
    points = []
    for _ in range(reps):  # lengths interleaved: a slow moment of the host spreads over all
        for n in lengths:
            res = lone_request(url, model, n, OUTPUT_TOKENS, vocab_size, rng)
            if res.ok and res.ttft_s is not None:
                # the deployment's own prefill time and the KV bytes its connector counted:
                # the simulator's service time and S_kv(l) (sim_vs_live/calibration.py)
                extra = {k: res.prfaas[k] for k in ("prefill_s", "kv_bytes", "kv_wire_bytes")
                         if isinstance(res.prfaas.get(k), (int, float))}
                points.append({"route": res.first_route, "length_tokens": int(n),
                               "ttft_s": round(float(res.ttft_s), 6),
                               **{k: round(float(v), 6) if k == "prefill_s" else int(v)
                                  for k, v in extra.items()}})
            time.sleep(PAUSE_S)
    return points


def _num(value: Any) -> float | None:
    return round(float(value), 6) if isinstance(value, (int, float)) else None


def route_overheads(points: list[dict[str, Any]], sim_ttft_s: list[float]
                    ) -> dict[str, float]:
    """Per route: median(idle live TTFT - simulated TTFT of the same lone request)."""
    out: dict[str, float] = {}
    for route in sorted({p["route"] for p in points}):
        diffs = [float(p["ttft_s"]) - s for p, s in zip(points, sim_ttft_s, strict=True)
                 if p["route"] == route]
        out[route] = round(float(np.median(diffs)), 6)
    return out
