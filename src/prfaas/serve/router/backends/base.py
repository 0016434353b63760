"""The router's worker-backend interface: ONE attempt of a request on a (prefill, decode) pair.

A `WorkerBackend` speaks one worker protocol (native NDJSON in native.py; others, e.g. vLLM's
OpenAI API, in their own files). `run(attempt, report)` starts the attempt, yields a
`TokenEvent` per generated token and returns after the last one, having filled `report`
(finish reason, prefill and transfer figures, cache deltas). Any failure raises
`AttemptFailed`: `emitted` says whether tokens of this attempt were already yielded, `worker`
names the worker at fault when the backend knows it (a refused connection, an error reply).

What a backend must NOT do: retry, pick another worker, resume, admit or shed load, or track
health. Those live above it (serve/router/dispatch.py,
serve/router/membership.py), so every backend gets
them for free. A backend uses the aiohttp session (and any ssl context) it is given, never
its own, and bounds every wait by the attempt's deadlines or its timeouts.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prfaas.serve.topology import WorkerSpec


class AttemptFailed(Exception):
    """One attempt failed; `emitted`: tokens already reached the caller; `worker`: a worker
    that could not be reached or dropped the connection, which the router marks down at once
    or answered a server error of its own ("" otherwise: a prefill worker whose KV push to a
    dead decoder failed answers 502 `transfer_failed`, and it is up)."""

    def __init__(self, message: str, emitted: bool = False, worker: str = "") -> None:
        super().__init__(message)
        self.emitted = emitted
        self.worker = worker


@dataclass(frozen=True, slots=True)
class Attempt:
    """What to run: the full prompt (a resumed request's prompt includes the tokens already
    generated), how many tokens to generate, on which pair, with which deadlines."""

    request_id: int
    token_ids: list[int]
    max_tokens: int
    sampling: Mapping[str, Any]  # the /generate `sampling` dict (temperature, top_p, seed, ...)
    prefill: WorkerSpec
    decode: WorkerSpec
    kv_dest: tuple[str, int]  # where the prefill worker ships the KV (host, port)
    first_token_s: float  # prefill (queue included) + KV transfer + first decode step
    prefill_s: float  # the prefill worker's answer, queueing and KV tail included
    kv_deadline_s: float  # the KV tail after the prefill computed (transfer-time based)
    token_s: float  # between two tokens
    connect_s: float  # opening a connection


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    extra: Mapping[str, Any] = field(default_factory=dict)  # backend fields, e.g. logprobs


@dataclass(slots=True)
class AttemptReport:
    """Filled by the backend while the attempt runs; read by the dispatcher afterwards."""

    finish_reason: str = ""
    decode_cached_tokens: int = 0  # prompt tokens the decoder already held (not shipped)
    cached_tokens: int = 0  # prompt tokens the prefill worker did not recompute
    computed_tokens: int = 0
    kv_bytes: int = 0
    kv_wire_bytes: int | None = None  # what crossed the link (link.compression); None: unknown
    prefill_s: float = 0.0
    prefill_queue_s: float = 0.0
    transfer_tail_s: float = 0.0
    prefill_done: bool = False  # the prefill worker answered (the figures above are real)
    kv_ready_unix_s: float | None = None  # the decoder held the KV (its wall clock)
    cache_deltas: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    prompt_logprobs: list[Any] | None = None  # asked by sampling["prompt_logprobs"] (echo)


class WorkerBackend(ABC):
    """Runs one attempt of a request on a worker pair (see the module docstring)."""

    name: str = "backend"

    @abstractmethod
    def run(self, attempt: Attempt, report: AttemptReport) -> AsyncIterator[TokenEvent]:
        """Yield the attempt's tokens; raise AttemptFailed on any failure."""


async def next_line(resp: aiohttp.ClientResponse, prefill: asyncio.Task[Any] | None,
                    timeout_s: float, waiting_for: str) -> bytes:
    """The decode stream's next line (b"" once it closed), read while watching the attempt's
    prefill task: a failed prefill ends the wait at once, and so does `timeout_s`."""
    read = asyncio.ensure_future(resp.content.readline())
    waits: set[asyncio.Future[Any]] = {read}
    if prefill is not None and not prefill.done():
        waits.add(prefill)
    elif prefill is not None and prefill.exception() is not None:
        read.cancel()
        raise prefill_failure(prefill)
    deadline = time.monotonic() + timeout_s
    while not read.done():
        done, _ = await asyncio.wait(waits, timeout=max(deadline - time.monotonic(), 0),
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            read.cancel()
            raise AttemptFailed(f"no {waiting_for} within {timeout_s:.1f} s")
        if prefill in done:
            waits.discard(prefill)
            if prefill.exception() is not None:
                read.cancel()
                raise prefill_failure(prefill)
    return read.result()


def prefill_failure(prefill: asyncio.Task[Any]) -> AttemptFailed:
    """The AttemptFailed a finished, failed prefill task stands for (its worker kept)."""
    exc = prefill.exception()
    if isinstance(exc, AttemptFailed):
        return AttemptFailed(str(exc), worker=exc.worker)
    return AttemptFailed(f"prefill: {exc}")
