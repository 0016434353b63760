"""How much two vLLM instances pinned to the same cores slow each other's prefill (measured).

Part of `prfaas profile --engine vllm` when the topology pins a second prefill worker to the
cores of the first (serve/cores.py): two standalone instances with the topology's engine
arguments on those cores (the profile's own instance and a twin started beside it, each with the
worker's idle spin). For each length, `reps` times: instance A alone (a `max_tokens: 1`
completion of a fresh random prompt, as T_prefill(l) is measured), then A and B at once with
prompts of that length; the rep's factor is the mean of the pair's wall times over A's time
alone. The profile's `core_sharing.factor` is the median over all reps: the slowdown of each of
two concurrent prefills (sim/sharing.py; 2.0 would be pure processor sharing of one core).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import aiohttp
import numpy as np

from prfaas.integrations.vllm.served_model import ServedModel

LENGTHS = (512, 1024, 2048)
REPS = 3
PAUSE_S = 0.1  # between calls: the idle spin (10 ms when pinned) is over


def how(reps: int, cores: str) -> str:
    return (f"two standalone vLLM instances pinned to cores {cores} (the topology's engine "
            f"arguments and idle spin): per length, {reps} times, A alone then A and B at once "
            f"(max_tokens=1 completions of fresh random token-id prompts, client wall time); "
            f"factor = median over reps of mean(pair walls) / A alone")


async def _walls(pairs: list[tuple[str, dict[str, Any]]], timeout_s: float) -> list[float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def one(url: str, body: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                resp.raise_for_status()
                await resp.read()
            return time.perf_counter() - t0

        return list(await asyncio.gather(*(one(u, b) for u, b in pairs)))


def measure(url_a: str, url_b: str, model: ServedModel, cores: str,
            lengths: tuple[int, ...] = LENGTHS, reps: int = REPS, seed: int = 5,
            timeout_s: float = 300.0) -> dict[str, Any]:
    """The profile's `core_sharing` section: {how, factor, points}."""
    rng = np.random.default_rng(seed)
    vocab = model.tokenizer().vocab_size

    def body(n: int) -> dict[str, Any]:
        return {"model": model.name, "max_tokens": 1, "temperature": 0.0,
                "prompt": [int(t) for t in rng.integers(3, vocab, n)]}

    asyncio.run(_walls([(url_a, body(min(lengths))), (url_b, body(min(lengths)))], timeout_s))
    points: list[dict[str, Any]] = []
    factors: list[float] = []
    for _ in range(reps):  # lengths interleaved: a slow moment of the host spreads over all
        for n in [x for x in lengths if x < model.max_context_tokens]:
            alone = asyncio.run(_walls([(url_a, body(n))], timeout_s))[0]
            time.sleep(PAUSE_S)
            pair = asyncio.run(_walls([(url_a, body(n)), (url_b, body(n))], timeout_s))
            time.sleep(PAUSE_S)
            factors.append(statistics.mean(pair) / alone)
            points.append({"length_tokens": n, "alone_s": round(alone, 6),
                           "pair_s": [round(x, 6) for x in pair],
                           "factor": round(factors[-1], 4)})
    return {"how": how(reps, cores), "factor": round(statistics.median(factors), 4),
            "points": points}
