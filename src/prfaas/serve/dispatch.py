"""One request's path through the workers, as the router drives it.

`Dispatcher.route` hashes the prompt's blocks, asks the GlobalKVCacheManager which instance
holds how much, and calls the policy (the same object the simulator calls) with a LiveView.
`Dispatcher.tokens` then runs one attempt: open the decode worker's NDJSON stream (it answers
`ready` with the prefix it holds), ask the prefill worker to compute and ship the rest, and
relay tokens. Until the first token, a failure anywhere (prefill 502, transfer error reported by
the decode worker, a timeout) cancels the attempt and retries on the local PD path, up to
`max_retries`; after it, the stream ends with a clear error. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prfaas.cache import GlobalKVCacheManager, chain_hashes
from prfaas.core.types import RequestInfo, Route, RouteDecision, RouteQuery
from prfaas.policy.base import Router, decide
from prfaas.serve.cluster import LiveCluster
from prfaas.serve.openai_api import ApiError, GenRequest
from prfaas.serve.topology import Topology, WorkerSpec


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    extra: dict[str, Any] = field(default_factory=dict)


class AttemptFailed(Exception):
    """One attempt failed; `emitted` says whether tokens already reached the client."""

    def __init__(self, message: str, emitted: bool = False) -> None:
        super().__init__(message)
        self.emitted = emitted


@dataclass(slots=True)
class Outcome:
    """What the `prfaas` object of a response reports, filled as the request runs."""

    route: str = ""
    prefill_node: str = ""
    decode_node: str = ""
    threshold_tokens: int | None = None
    cached_tokens: int = 0  # prompt tokens the prefill node did not recompute
    decode_cached_tokens: int = 0  # prompt tokens the decode node already held (not shipped)
    kv_bytes: int = 0
    prefill_s: float = 0.0
    prefill_queue_s: float = 0.0  # waiting at the prefill worker before compute
    transfer_tail_s: float = 0.0  # prefill end -> last KV frame acknowledged
    finish_reason: str = ""
    retried: bool = False
    retry_reason: str = ""
    token_ids: list[int] = field(default_factory=list)
    router_s: float = 0.0  # router CPU time, waits on workers excluded
    transfers: int = 0  # prefills that shipped KV for this request (attempts)
    prompt_logprobs: list[Any] | None = None  # echo: the prefill's prompt logprobs

    def to_json(self) -> dict[str, Any]:
        return {"route": self.route, "prefill_node": self.prefill_node,
                "decode_node": self.decode_node, "cached_tokens": self.cached_tokens,
                "decode_cached_tokens": self.decode_cached_tokens, "kv_bytes": self.kv_bytes,
                "threshold_tokens": self.threshold_tokens, "prefill_s": self.prefill_s,
                "prefill_queue_s": self.prefill_queue_s, "transfer_tail_s": self.transfer_tail_s,
                "retried": self.retried, "retry_reason": self.retry_reason,
                "token_ids": self.token_ids, "router_overhead_s": self.router_s}


class Dispatcher:
    def __init__(self, topology: Topology, cluster: LiveCluster, manager: GlobalKVCacheManager,
                 policy: Router, session: aiohttp.ClientSession, block_size_tokens: int) -> None:
        self.topology, self.cluster, self.manager = topology, cluster, manager
        self.policy, self.session = policy, session
        self.block_size_tokens = block_size_tokens
        self._ids = itertools.count(1)

    def route(self, req: GenRequest, request_id: str) -> tuple[RouteQuery, RouteDecision]:
        hashes = chain_hashes(req.token_ids, self.block_size_tokens)
        match = self.manager.match(hashes)
        cached = {i: match.cached_tokens(i) for i in self.manager.instances
                  if match.cached_tokens(i) > 0}
        view = self.cluster.view()
        info = RequestInfo(request_id, len(req.token_ids), req.max_tokens, view.now_s,
                           tuple(hashes))
        query = RouteQuery(info, cached)
        decision = self.policy.route(query, view)
        if decision.rejected and decision.unavailable:  # no path up: not the client's fault
            raise ApiError(503, f"no path can serve: {decision.reason}", kind="server_error",
                           code="unavailable")
        if decision.rejected:
            raise ApiError(429, f"rejected by policy {self.policy.name}: {decision.reason}",
                           kind="rate_limit_error", code="rejected")
        if decision.decode_instance is None:
            raise ApiError(503, "no decode instance available", kind="server_error")
        return query, decision

    async def tokens(self, req: GenRequest, query: RouteQuery, decision: RouteDecision,
                     out: Outcome) -> AsyncIterator[TokenEvent]:
        for attempt in range(self.topology.max_retries + 1):
            self._describe(decision, out)
            try:
                async for token in self._attempt(req, decision, out):
                    yield token
                return
            except AttemptFailed as exc:
                if exc.emitted or attempt == self.topology.max_retries:
                    raise ApiError(502, f"request failed on {out.prefill_node} -> "
                                        f"{out.decode_node}: {exc}", kind="server_error",
                                   code="transfer_failed") from exc
                out.retried, out.retry_reason = True, str(exc)
                decision = decide(query, self.cluster.view(), Route.PD, decision.threshold_tokens)
                if decision.rejected or decision.decode_instance is None:
                    raise ApiError(502, f"{exc}; no local path to retry on: {decision.reason}",
                                   kind="server_error", code="transfer_failed") from exc

    def _describe(self, decision: RouteDecision, out: Outcome) -> None:
        out.route = decision.route.value
        out.prefill_node = decision.prefill_instance
        out.decode_node = decision.decode_instance or ""
        out.threshold_tokens = decision.threshold_tokens

    async def _attempt(self, req: GenRequest, decision: RouteDecision, out: Outcome
                       ) -> AsyncIterator[TokenEvent]:
        rid = next(self._ids)
        pre = self.topology.worker(decision.prefill_instance)
        dec = self.topology.worker(decision.decode_instance or "")
        work_s = self.cluster.prefill_time_s(pre.name, len(req.token_ids), decision.cached_tokens)
        pending_bytes = self.cluster.kv_expected_bytes(pre, decision.uncached_tokens)
        self.cluster.start(pre.name, work_s)
        self.cluster.start(dec.name)
        self.cluster.monitor.add_pending(pending_bytes)
        t = self.topology.timeouts
        sampling = req.sampling()
        body = {"request_id": rid, "token_ids": req.token_ids, "max_tokens": req.max_tokens,
                "sampling": sampling}
        prefill: asyncio.Task[dict[str, Any]] | None = None
        emitted = False
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s)
            async with self.session.post(f"{dec.url}/generate", json=body,
                                         timeout=timeout) as resp:
                if resp.status != 200:
                    raise AttemptFailed(f"decode {dec.name} answered HTTP {resp.status}")
                ready = await self._event(resp, None, t.connect_s + t.token_s)
                out.decode_cached_tokens = int(ready.get("cached_tokens", 0))
                prefill = asyncio.create_task(self._prefill(
                    pre, dec, rid, req.token_ids, out.decode_cached_tokens,
                    sampling.get("prompt_logprobs")))
                first_wait = t.prefill_s + t.kv_s
                while True:
                    event = await self._event(resp, None if emitted else prefill,
                                              t.token_s if emitted else first_wait)
                    kind = event.get("event")
                    if kind == "token":
                        emitted = True
                        out.token_ids.append(int(event["id"]))
                        yield TokenEvent(int(event["id"]), {k: v for k, v in event.items()
                                                            if k not in ("event", "id")})
                    elif kind == "done":
                        out.finish_reason = str(event.get("finish_reason", "stop"))
                        self._apply_cache(dec.name, event.get("cache"))
                        break
                    else:
                        raise AttemptFailed(f"decode {dec.name}: {event.get('message', event)}",
                                            emitted)
                self._prefill_done(pre, await asyncio.wait_for(prefill, t.prefill_s), out)
        except AttemptFailed as exc:
            exc.emitted = exc.emitted or emitted
            await self._cancel(dec, rid)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await self._cancel(dec, rid)
            raise AttemptFailed(f"{type(exc).__name__}: {exc}", emitted) from exc
        finally:
            if prefill is not None and not prefill.done():
                prefill.cancel()
            self.cluster.finish(pre.name, work_s)
            self.cluster.finish(dec.name)
            self.cluster.monitor.remove_pending(pending_bytes)

    async def _event(self, resp: aiohttp.ClientResponse, prefill: asyncio.Task[Any] | None,
                     timeout_s: float) -> dict[str, Any]:
        """The decode stream's next event; a failed prefill ends the wait early."""
        read = asyncio.ensure_future(resp.content.readline())
        waits: set[asyncio.Future[Any]] = {read}
        if prefill is not None and not prefill.done():
            waits.add(prefill)
        elif prefill is not None and prefill.exception() is not None:
            read.cancel()
            raise AttemptFailed(str(prefill.exception()))
        deadline = time.monotonic() + timeout_s
        while not read.done():
            done, _ = await asyncio.wait(waits, timeout=max(deadline - time.monotonic(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                read.cancel()
                raise AttemptFailed(f"no event from the decode worker within {timeout_s:.0f} s")
            if prefill in done:
                waits.discard(prefill)
                if prefill.exception() is not None:
                    read.cancel()
                    raise AttemptFailed(str(prefill.exception()))
        raw = read.result()
        if not raw:
            raise AttemptFailed("the decode worker closed the stream early")
        event: dict[str, Any] = json.loads(raw)
        return event

    async def _prefill(self, pre: WorkerSpec, dec: WorkerSpec, rid: int, token_ids: list[int],
                       ship_from: int, prompt_logprobs: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"request_id": rid, "token_ids": token_ids,
                                "ship_from_tokens": ship_from,
                                "dest": {"host": dec.host, "port": dec.kv_port}}
        if prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs
        t = self.topology.timeouts
        timeout = aiohttp.ClientTimeout(total=t.prefill_s, sock_connect=t.connect_s)
        try:
            async with self.session.post(f"{pre.url}/prefill", json=body,
                                         timeout=timeout) as resp:
                reply: dict[str, Any] = await resp.json(content_type=None)
                if resp.status != 200:
                    err = reply.get("error", {}) if isinstance(reply, dict) else {}
                    raise AttemptFailed(f"prefill {pre.name} answered HTTP {resp.status}: "
                                        f"{err.get('message', reply)}")
                return reply
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptFailed(f"prefill {pre.name}: {type(exc).__name__}: {exc}") from exc

    def _prefill_done(self, pre: WorkerSpec, reply: dict[str, Any], out: Outcome) -> None:
        out.cached_tokens = int(reply.get("cached_tokens", 0))
        out.kv_bytes = int(reply.get("kv_bytes", 0))
        out.prefill_s = float(reply.get("prefill_s", 0.0))
        out.prefill_queue_s = float(reply.get("queue_s", 0.0))
        out.transfer_tail_s = float(reply.get("transfer_tail_s", 0.0))
        out.transfers += 1
        if isinstance(reply.get("prompt_logprobs"), list):
            out.prompt_logprobs = reply["prompt_logprobs"]
        computed = int(reply.get("computed_tokens", 0))
        if computed > 0:
            self.cluster.measured(pre.name, out.prefill_s / computed)
        self.cluster.shipped(pre, out.kv_bytes)
        self._apply_cache(pre.name, reply.get("cache"))

    def _apply_cache(self, pool: str, delta: object) -> None:
        if not isinstance(delta, dict):
            return
        inserted = [int(h) for h in delta.get("inserted", [])]
        evicted = [int(h) for h in delta.get("evicted", [])]
        if evicted:
            self.manager.on_evict(pool, evicted, evicted)
        if inserted:
            self.manager.on_insert(pool, inserted, inserted)

    async def _cancel(self, dec: WorkerSpec, rid: int) -> None:
        timeout = aiohttp.ClientTimeout(total=self.topology.timeouts.connect_s)
        try:
            async with self.session.post(f"{dec.url}/cancel", json={"request_id": rid},
                                         timeout=timeout) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # the decode worker is gone or busy; its own kv timeout ends the wait
