"""The router's worker-backend interface: ONE attempt of a request on a (prefill, decode) pair.

A `WorkerBackend` speaks one worker protocol (native NDJSON in native.py; others, e.g. vLLM's
OpenAI API, in their own files). `run(attempt, report)` starts the attempt, yields a
`TokenEvent` per generated token and returns after the last one, having filled `report`
(finish reason, prefill and transfer figures, cache deltas). Any failure raises
`AttemptFailed`: `emitted` says whether tokens of this attempt were already yielded, `worker`
names the worker at fault when the backend knows it (a refused connection, an error reply).

What a backend must NOT do: retry, pick another worker, resume, admit or shed load, or track
health. Those live above it (serve/dispatch.py, serve/membership.py), so every backend gets
them for free. A backend uses the aiohttp session (and any ssl context) it is given, never
its own, and bounds every wait by the attempt's deadlines or its timeouts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prfaas.serve.topology import WorkerSpec


class AttemptFailed(Exception):
    """One attempt failed; `emitted`: tokens already reached the caller; `worker`: the worker
    at fault, when known ("" otherwise)."""

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
    prefill_s: float = 0.0
    prefill_queue_s: float = 0.0
    transfer_tail_s: float = 0.0
    prefill_done: bool = False  # the prefill worker answered (the figures above are real)
    cache_deltas: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    prompt_logprobs: list[Any] | None = None  # asked by sampling["prompt_logprobs"] (echo)


class WorkerBackend(ABC):
    """Runs one attempt of a request on a worker pair (see the module docstring)."""

    name: str = "backend"

    @abstractmethod
    def run(self, attempt: Attempt, report: AttemptReport) -> AsyncIterator[TokenEvent]:
        """Yield the attempt's tokens; raise AttemptFailed on any failure."""
