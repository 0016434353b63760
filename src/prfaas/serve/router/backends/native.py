"""The native worker protocol (serve/worker/prefill_worker.py, serve/worker/decode_worker.py).

One attempt: open the decode worker's `POST /generate` NDJSON stream (it answers `ready` with
the prefix it holds), ask the prefill worker (`POST /prefill`) to compute and ship the rest to
the decoder's KV port, and relay `token` lines until `done`. A failed prefill ends the wait for
the next line early; on any failure the decode worker is told to `/cancel` the request, so
neither side keeps waiting. Every wait is bounded by the attempt's deadlines.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from prfaas.serve.router.backends.base import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
    next_line,
)
from prfaas.serve.topology import WorkerSpec

TENANT_KEY_ENV = "PRFAAS_TENANT_KEY"  # (serve/gateway.py reads the same name)


class NativeBackend(WorkerBackend):
    name = "native"

    def __init__(self, session: aiohttp.ClientSession, **_: object) -> None:
        self.session = session
        # a PD cluster's key for a shared PrfaaS cluster's gateway (serve/gateway.py)
        key = os.environ.get(TENANT_KEY_ENV)
        self._prfaas_headers = {"Authorization": f"Bearer {key}"} if key else None

    async def run(self, attempt: Attempt, report: AttemptReport) -> AsyncIterator[TokenEvent]:
        a, dec = attempt, attempt.decode
        body = {"request_id": a.request_id, "token_ids": a.token_ids,
                "max_tokens": a.max_tokens, "sampling": dict(a.sampling)}
        prefill: asyncio.Task[dict[str, Any]] | None = None
        emitted = False
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=a.connect_s)
            async with self.session.post(f"{dec.url}/generate", json=body,
                                         timeout=timeout) as resp:
                if resp.status != 200:
                    raise AttemptFailed(f"decode {dec.name} answered HTTP {resp.status}",
                                        worker=dec.name if resp.status >= 500 else "")
                ready = await _event(resp, None, a.connect_s + a.token_s, dec.name)
                report.decode_cached_tokens = int(ready.get("cached_tokens", 0))
                prefill = asyncio.create_task(self._prefill(a, report.decode_cached_tokens,
                                                            ready.get("nonce")))
                while True:
                    event = await _event(resp, None if emitted else prefill,
                                         a.token_s if emitted else a.first_token_s, dec.name)
                    kind = event.get("event")
                    if kind == "token":
                        emitted = True
                        yield TokenEvent(int(event["id"]),
                                         {k: v for k, v in event.items()
                                          if k not in ("event", "id")})
                    elif kind == "done":
                        report.finish_reason = str(event.get("finish_reason", "stop"))
                        if isinstance(event.get("kv_ready_unix_s"), (int, float)):
                            report.kv_ready_unix_s = float(event["kv_ready_unix_s"])
                        if isinstance(event.get("cache"), dict):
                            report.cache_deltas.append((dec.name, event["cache"]))
                        break
                    else:
                        raise AttemptFailed(f"decode {dec.name}: "
                                            f"{event.get('message', event)}", emitted)
                _prefill_done(a.prefill, await asyncio.wait_for(prefill, a.prefill_s),
                              report)
        except AttemptFailed as exc:
            exc.emitted = exc.emitted or emitted
            await self._cancel(dec, a.request_id, a.connect_s)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await self._cancel(dec, a.request_id, a.connect_s)
            raise AttemptFailed(f"{type(exc).__name__}: {exc}", emitted, dec.name) from exc
        finally:
            if prefill is not None and not prefill.done():
                prefill.cancel()

    async def _prefill(self, a: Attempt, ship_from: int, nonce: object) -> dict[str, Any]:
        pre = a.prefill
        # `nonce`: the decoder's challenge for this attempt, bound into the KV manifest
        body = {"request_id": a.request_id, "token_ids": a.token_ids,
                "ship_from_tokens": ship_from, "kv_deadline_s": a.kv_deadline_s,
                "dest": {"host": a.kv_dest[0], "port": a.kv_dest[1]}, "nonce": nonce}
        if a.sampling.get("prompt_logprobs") is not None:  # echo: the prefill computes them
            body["prompt_logprobs"] = a.sampling["prompt_logprobs"]
        timeout = aiohttp.ClientTimeout(total=a.prefill_s, sock_connect=a.connect_s)
        try:
            headers = self._prfaas_headers if pre.role == "prfaas" else None
            async with self.session.post(f"{pre.url}/prefill", json=body, timeout=timeout,
                                         server_hostname=pre.tls_name,
                                         headers=headers) as resp:
                reply: dict[str, Any] = await resp.json(content_type=None)
                if resp.status != 200:
                    err = reply.get("error", {}) if isinstance(reply, dict) else {}
                    # it answered, so it is up; `transfer_failed` is its KV push failing
                    # (the decoder or the link is at fault, and they say so themselves)
                    blame = resp.status >= 500 and err.get("type") != "transfer_failed"
                    raise AttemptFailed(f"prefill {pre.name} answered HTTP {resp.status}: "
                                        f"{err.get('message', reply)}",
                                        worker=pre.name if blame else "")
                return reply
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptFailed(f"prefill {pre.name}: {type(exc).__name__}: {exc}",
                                worker=pre.name) from exc

    async def _cancel(self, dec: WorkerSpec, rid: int, connect_s: float) -> None:
        timeout = aiohttp.ClientTimeout(total=connect_s)
        try:
            async with self.session.post(f"{dec.url}/cancel", json={"request_id": rid},
                                         timeout=timeout) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # the decode worker is gone or busy; its own kv timeout ends the wait


def _prefill_done(pre: WorkerSpec, reply: dict[str, Any], report: AttemptReport) -> None:
    report.prefill_done = True
    report.cached_tokens = int(reply.get("cached_tokens", 0))
    report.computed_tokens = int(reply.get("computed_tokens", 0))
    report.kv_bytes = int(reply.get("kv_bytes", 0))
    if reply.get("kv_wire_bytes") is not None:
        report.kv_wire_bytes = int(reply["kv_wire_bytes"])
    report.prefill_s = float(reply.get("prefill_s", 0.0))
    report.prefill_queue_s = float(reply.get("queue_s", 0.0))
    report.transfer_tail_s = float(reply.get("transfer_tail_s", 0.0))
    if isinstance(reply.get("cache"), dict):
        report.cache_deltas.append((pre.name, reply["cache"]))
    if isinstance(reply.get("prompt_logprobs"), list):
        report.prompt_logprobs = reply["prompt_logprobs"]


async def _event(resp: aiohttp.ClientResponse, prefill: asyncio.Task[Any] | None,
                 timeout_s: float, decoder: str) -> dict[str, Any]:
    """The decode stream's next event; a failed prefill ends the wait early."""
    raw = await next_line(resp, prefill, timeout_s, "event from the decode worker")
    if not raw:
        raise AttemptFailed(f"the decode worker {decoder} closed the stream early",
                            worker=decoder)
    event: dict[str, Any] = json.loads(raw)
    return event
