"""Open-loop load generation: send each request at its arrival time, stream the answer (SSE),
and time it on the client side.

TTFT = from sending to the first token chunk; TPOT = (end - first token) / (tokens - 1).
The `prfaas` object of the last chunk gives the route, KV bytes, cached tokens and the
router's own CPU time for the request (its overhead), which the report sets against the
client-side end-to-end time. Every request has a timeout; failures are recorded, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from prfaas.bench.workload import BenchRequest


def sse_payload(raw: bytes) -> dict[str, Any] | None:
    """One line of an OpenAI-style SSE stream: its `data:` JSON object, or None for any other
    line (blank, comment, event) and the closing `data: [DONE]`. Bad JSON raises ValueError."""
    line = raw.decode().strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    payload: dict[str, Any] = json.loads(line[6:])
    return payload


def sse_payloads(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The `data:` objects of a stream read line by line (e.g. a urllib response)."""
    for raw in lines:
        if (payload := sse_payload(raw)) is not None:
            yield payload


async def sse_payloads_async(lines: AsyncIterable[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The same for an aiohttp response's `content`, each object as soon as its line is in."""
    async for raw in lines:
        if (payload := sse_payload(raw)) is not None:
            yield payload


@dataclass(slots=True)
class Result:
    index: int
    input_bytes: int
    max_tokens: int
    sent_s: float = 0.0  # relative to the run's start
    sent_unix_s: float = 0.0  # wall clock at sending (to place a server's wall-clock stamps)
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    status: int = 0
    error: str = ""
    retry_after: str | None = None  # the Retry-After header of a 429/503
    prfaas: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def first_route(self) -> str:
        """The router's first decision ("pd", "prfaas"; "" when it said none): before any
        retry moved the request local, where `prfaas.route` is the last."""
        return str(self.prfaas.get("first_route") or self.prfaas.get("route") or "")

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["prfaas"] = {k: v for k, v in self.prfaas.items() if k != "token_ids"}
        out["tpot_s"] = self.tpot_s
        return out


async def _one(session: aiohttp.ClientSession, url: str, model: str, index: int,
               req: BenchRequest, t_run: float, timeout_s: float) -> Result:
    res = Result(index, len(req.prompt), req.max_tokens, sent_s=time.perf_counter() - t_run,
                 sent_unix_s=time.time())
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.retry_after = resp.headers.get("Retry-After")
                text = await resp.text()
                res.error = text[:300]
                with contextlib.suppress(ValueError, AttributeError):
                    res.prfaas = dict(json.loads(text).get("prfaas") or {})  # where it went
                return res
            async for chunk in sse_payloads_async(resp.content):
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                if chunk.get("choices") and res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - t0
                if "prfaas" in chunk:
                    res.prfaas = chunk["prfaas"]
                    res.output_tokens = len(chunk["prfaas"].get("token_ids", []))
        res.e2e_s = time.perf_counter() - t0
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    return res


async def run_load(url: str, model: str, requests: list[BenchRequest], arrivals_s: list[float],
                   timeout_s: float = 300.0,
                   on_done: Callable[[Result], None] | None = None,
                   deadline_s: float | None = None) -> list[Result]:
    """Send requests[i % len(requests)] at arrivals_s[i]; returns results in arrival order.
    `deadline_s`: no request runs past this many seconds from the run's start (one still
    running then ends with a TimeoutError, as one past its own `timeout_s` does)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t_run = time.perf_counter()

        async def fire(i: int, at_s: float) -> Result:
            await asyncio.sleep(max(at_s - (time.perf_counter() - t_run), 0.0))
            limit = timeout_s if deadline_s is None else \
                max(min(timeout_s, deadline_s - (time.perf_counter() - t_run)), 1e-3)
            res = await _one(session, url, model, i, requests[i % len(requests)], t_run, limit)
            if on_done is not None:
                on_done(res)
            return res

        return list(await asyncio.gather(*(fire(i, t) for i, t in enumerate(arrivals_s))))
