"""One request's path through the workers, as the router drives it.

`Dispatcher.route` hashes the prompt's blocks, asks the GlobalKVCacheManager which instance
holds how much, and calls the policy (the same object the simulator calls) with a LiveView.
`Dispatcher.tokens` then runs attempts through a `WorkerBackend` (backends/: one attempt
on one (prefill, decode) pair, in the workers' protocol) and keeps the router's bookkeeping
(loads, link pending bytes, cache deltas) around each. A failed attempt (prefill 502, transfer
error, a timeout, a worker going down: failover.guarded) is retried on the local PD path when
no token was sent yet, or resumed when some were: prompt + emitted tokens is re-prefilled on a
healthy path and decoding continues there for the tokens left; the client sees one unbroken
stream (`retried` / `resumed` in the `prfaas` object). At most `max_retries` failures per
request; a path that is down is waited for up to `health.path_wait_s`. Every wait is bounded;
the KV one by a deadline from the predicted transfer time (`kv_deadline`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prfaas.cache import GlobalKVCacheManager, chain_hashes
from prfaas.core.types import RequestInfo, RouteDecision, RouteQuery
from prfaas.models.tokenizer import ByteTokenizer
from prfaas.policy.base import Router
from prfaas.policy.retry import FailedRequest, RetryAction, RetryPolicy
from prfaas.policy.spill import SpillAction, SpillPolicy
from prfaas.serve.router.backends import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
    make_backend,
)
from prfaas.serve.router.cluster import UNSHAPED_GBPS, LiveCluster, LiveView
from prfaas.serve.router.failover import guarded, wait_for_path
from prfaas.serve.router.membership import Membership
from prfaas.serve.router.openai_api import ApiError, GenRequest
from prfaas.serve.topology import Topology, WorkerSpec


@dataclass(slots=True)
class Outcome:
    """What the `prfaas` object of a response reports, filled as the request runs."""

    route: str = ""
    first_route: str = ""  # the policy's choice, before any retry moved the request
    prefill_node: str = ""
    decode_node: str = ""
    threshold_tokens: int | None = None
    cached_tokens: int = 0  # prompt tokens the prefill node did not recompute
    # what the router's KVCache manager counted cached per instance when it routed (> 0 only)
    router_cached_tokens: dict[str, int] = field(default_factory=dict)
    decode_cached_tokens: int = 0  # prompt tokens the decode node already held (not shipped)
    kv_bytes: int = 0
    kv_wire_bytes: int | None = None  # kv_bytes as they crossed the link; None: not reported
    prefill_s: float = 0.0
    prefill_queue_s: float = 0.0  # waiting at the prefill worker before compute
    transfer_tail_s: float = 0.0  # prefill end -> last KV frame acknowledged
    # the decoder held this request's KV (its first token is then sampled): wall clock of the
    # decode worker's host, from the first attempt that finished; None where the backend is silent
    kv_ready_unix_s: float | None = None
    finish_reason: str = ""
    retried: bool = False
    retry_reason: str = ""
    resumed: int = 0  # times the request continued on another path after tokens were sent
    resume_reason: str = ""
    # tokens already sent at each resume: what the next path re-prefilled after the prompt
    resumed_at: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    router_s: float = 0.0  # router CPU time, waits on workers excluded
    transfers: int = 0  # prefills that shipped KV for this request (one per attempt; n > 1: 1)
    prompt_logprobs: list[Any] | None = None  # echo + logprobs: the prefill's, for the prompt

    def to_json(self) -> dict[str, Any]:
        return {"route": self.route, "first_route": self.first_route,
                "prefill_node": self.prefill_node,
                "decode_node": self.decode_node, "cached_tokens": self.cached_tokens,
                "decode_cached_tokens": self.decode_cached_tokens,
                "router_cached_tokens": self.router_cached_tokens, "kv_bytes": self.kv_bytes,
                "kv_wire_bytes": self.kv_wire_bytes,
                "threshold_tokens": self.threshold_tokens, "prefill_s": self.prefill_s,
                "prefill_queue_s": self.prefill_queue_s, "transfer_tail_s": self.transfer_tail_s,
                "kv_ready_unix_s": self.kv_ready_unix_s,
                "retried": self.retried, "retry_reason": self.retry_reason,
                "resumed": self.resumed, "resume_reason": self.resume_reason,
                "resumed_at": self.resumed_at, "token_ids": self.token_ids,
                "router_overhead_s": self.router_s}


class Dispatcher:
    def __init__(self, topology: Topology, cluster: LiveCluster, manager: GlobalKVCacheManager,
                 policy: Router, session: aiohttp.ClientSession, block_size_tokens: int,
                 backend: WorkerBackend | None = None, membership: Membership | None = None
                 ) -> None:
        self.topology, self.cluster, self.manager = topology, cluster, manager
        self.policy, self.session = policy, session
        self.backend = backend or make_backend("native", session=session)
        self.membership = membership
        self.queued: Counter[str] = Counter()  # attempts waiting for their first token, by prefill
        self.failed_attempts: Counter[str] = Counter()  # by route (prfaas, pd): /metrics
        self.spill = SpillPolicy(topology.admission.max_queued_per_prefill)
        self.retry = RetryPolicy(topology.max_retries)
        self.eos_id = ByteTokenizer().eos_id
        self.block_size_tokens = block_size_tokens
        self.exact_match = False  # True: the manager's pools need not be prefix-closed
        # called with every accepted (query, decision), e.g. the shape controller's window
        self.observers: list[Callable[[RouteQuery, RouteDecision], None]] = []
        self._ids = itertools.count(1)

    def route(self, req: GenRequest, request_id: str) -> tuple[RouteQuery, RouteDecision]:
        hashes = chain_hashes(req.token_ids, self.block_size_tokens)
        match = self.manager.match(hashes, exact=self.exact_match)
        cached = {i: match.cached_tokens(i) for i in self.manager.instances
                  if match.cached_tokens(i) > 0}
        view = self.cluster.view()
        info = RequestInfo(request_id, len(req.token_ids), req.max_tokens, view.now_s,
                           tuple(hashes))
        query = RouteQuery(info, cached)
        decision = self.policy.route(query, view)
        if decision.rejected and decision.unavailable:  # no path up: not the client's fault
            raise ApiError(503, f"no path can serve: {decision.reason}", kind="server_error",
                           code="unavailable", retry_after_s=self.topology.health.retry_after_s)
        if decision.rejected:
            raise ApiError(429, f"rejected by policy {self.policy.name}: {decision.reason}",
                           kind="rate_limit_error", code="rejected")
        if decision.decode_instance is None:
            raise ApiError(503, "no decode instance available", kind="server_error",
                           code="unavailable", retry_after_s=self.topology.health.retry_after_s)
        decision = self._admit(query, view, decision)
        for observe in self.observers:
            observe(query, decision)
        return query, decision

    def _admit(self, query: RouteQuery, view: LiveView, decision: RouteDecision
               ) -> RouteDecision:
        """The decision, or the other route's when the chosen prefill worker's queue is full
        (policy/spill.py, which the simulator calls too); 429 with Retry-After when both are
        full."""
        verdict = self.spill.admit(query, view, decision, self.queued)
        if verdict.action is SpillAction.FULL:
            raise ApiError(429, verdict.decision.reason, kind="rate_limit_error",
                           code="queue_full",
                           retry_after_s=self.topology.admission.retry_after_s)
        return verdict.decision

    async def tokens(self, req: GenRequest, query: RouteQuery, decision: RouteDecision,
                     out: Outcome) -> AsyncGenerator[TokenEvent, None]:
        """The request's tokens, across attempts: what follows a failed one (retry on the
        local path, resume from the tokens already sent, finish, or give up) is the retry
        policy's decision (policy/retry.py, via failover.wait_for_path)."""
        failures = 0
        while True:
            self._describe(decision, out)
            try:
                async for event in self._attempt(req, decision, out):
                    yield event
                return
            except AttemptFailed as exc:
                failures += 1
                self.failed_attempts[decision.route.value] += 1
                if exc.worker and self.membership is not None:
                    self.membership.suspect(exc.worker, str(exc))
                after = await self._after_failure(req, query, decision, out, failures, exc)
                if after is None:  # the failed attempt had sent every token
                    return
                decision = after

    async def _after_failure(self, req: GenRequest, query: RouteQuery, failed: RouteDecision,
                             out: Outcome, failures: int, exc: AttemptFailed
                             ) -> RouteDecision | None:
        """The next attempt's decision; None when the request is finished."""
        where = f"{out.prefill_node} -> {out.decode_node}"
        emitted = len(out.token_ids)
        stopped = bool(out.token_ids) and out.token_ids[-1] == self.eos_id \
            and not req.ignore_eos
        state = FailedRequest(query, emitted, failures, req.best_of, stopped,
                              failed.threshold_tokens)
        health = self.topology.health
        verdict = await wait_for_path(self.retry, state, self.cluster.view, health.path_wait_s,
                                      health.interval_s)
        if verdict.action is RetryAction.GIVE_UP:
            raise ApiError(502, f"request failed on {where} ({verdict.reason}): {exc}",
                           kind="server_error", code="transfer_failed") from exc
        if emitted:
            out.resumed += 1
            out.resume_reason = f"{where}: {exc}"
            out.resumed_at.append(emitted)
        else:
            out.retried, out.retry_reason = True, str(exc)
        if verdict.action is RetryAction.FINISHED:
            out.finish_reason = verdict.reason
            return None
        if verdict.action is RetryAction.NO_PATH or verdict.decision is None:
            raise ApiError(502, f"{exc}; no local path to retry on: {verdict.reason}",
                           kind="server_error", code="transfer_failed") from exc
        return verdict.decision

    def _describe(self, decision: RouteDecision, out: Outcome) -> None:
        out.route = decision.route.value
        out.first_route = out.first_route or out.route
        out.prefill_node = decision.prefill_instance
        out.decode_node = decision.decode_instance or ""
        out.threshold_tokens = decision.threshold_tokens

    async def _attempt(self, req: GenRequest, decision: RouteDecision, out: Outcome
                       ) -> AsyncIterator[TokenEvent]:
        pre = self.topology.worker(decision.prefill_instance)
        dec = self.topology.worker(decision.decode_instance or "")
        work_s = self.cluster.prefill_time_s(pre.name, len(req.token_ids), decision.cached_tokens)
        pending_bytes = self.cluster.kv_expected_bytes(pre, decision.uncached_tokens)
        t = self.topology.timeouts
        # a resumed request: what was generated is prompt now, and counts against max_tokens
        prompt = req.token_ids + out.token_ids
        sampling = req.sampling()
        if out.token_ids:  # the decoder counts them as output (penalties, seed steps, stops)
            sampling["output_offset"] = len(out.token_ids)
        attempt = Attempt(next(self._ids), prompt, req.max_tokens - len(out.token_ids),
                          sampling, pre, dec, self.topology.kv_dest(pre, dec),
                          first_token_s=t.prefill_s + t.kv_s, prefill_s=t.prefill_s,
                          kv_deadline_s=self._kv_deadline_s(pre, decision.uncached_tokens),
                          token_s=t.token_s, connect_s=t.connect_s)
        report = AttemptReport()
        self.cluster.start(pre.name, work_s)
        self.cluster.start(dec.name)
        self.cluster.monitor.add_pending(pending_bytes)
        self.queued[pre.name] += 1
        first = True
        try:
            async for event in guarded(self.backend.run(attempt, report),
                                       lambda: self._watch(pre, dec, report)):
                if first:  # the prefill is done: the worker's queue moves on (cluster.py)
                    self.queued[pre.name] -= 1
                    self.cluster.finish(pre.name, work_s)
                    first = False
                out.token_ids.append(event.token_id)
                yield event
            out.finish_reason = report.finish_reason
        finally:
            if first:
                self.queued[pre.name] -= 1
                self.cluster.finish(pre.name, work_s)
            self._apply_report(pre, report, out)
            self.cluster.finish(dec.name)
            self.cluster.monitor.remove_pending(pending_bytes)

    def _watch(self, pre: WorkerSpec, dec: WorkerSpec, report: AttemptReport
               ) -> list[tuple[str, asyncio.Event]]:
        """The workers whose loss ends the attempt now: the prefill one until it answered."""
        if self.membership is None:
            return []
        names = [dec.name] if report.prefill_done else [pre.name, dec.name]
        return [(n, self.membership.down_event(n)) for n in names]

    def _kv_deadline_s(self, pre: WorkerSpec, shipped_tokens: int) -> float:
        """How long the KV may take after the prefill computed: the predicted transfer time
        on this worker's link, times a margin, with a floor (resilience.DeadlineSpec)."""
        rate = self.topology.link_of(pre).rate_gbps or UNSHAPED_GBPS
        predicted_s = (self.cluster.geometry.size_bytes(max(shipped_tokens, 1))
                       * self.cluster.wire_fraction(pre) * 8 / (rate * 1e9))
        return min(self.topology.kv_deadline.deadline_s(predicted_s), self.topology.timeouts.kv_s)

    def _apply_report(self, pre: WorkerSpec, report: AttemptReport, out: Outcome) -> None:
        out.decode_cached_tokens = report.decode_cached_tokens
        if report.kv_ready_unix_s is not None and out.kv_ready_unix_s is None:
            out.kv_ready_unix_s = report.kv_ready_unix_s  # only a finished attempt says
        for pool, delta in report.cache_deltas:
            self._apply_cache(pool, delta)
        if not report.prefill_done:
            return
        out.cached_tokens, out.kv_bytes = report.cached_tokens, report.kv_bytes
        out.kv_wire_bytes = report.kv_wire_bytes
        out.prefill_s, out.prefill_queue_s = report.prefill_s, report.prefill_queue_s
        out.transfer_tail_s = report.transfer_tail_s
        out.transfers += 1
        if out.prompt_logprobs is None:
            out.prompt_logprobs = report.prompt_logprobs
        if report.computed_tokens > 0:
            self.cluster.measured(pre.name, report.prefill_s,
                                  report.cached_tokens + report.computed_tokens,
                                  report.cached_tokens)
        self.cluster.shipped(pre, report.kv_bytes, report.kv_wire_bytes)

    def _apply_cache(self, pool: str, delta: object) -> None:
        if not isinstance(delta, Mapping):
            return
        inserted = [int(h) for h in delta.get("inserted", [])]
        evicted = [int(h) for h in delta.get("evicted", [])]
        if evicted:
            self.manager.on_evict(pool, evicted, evicted)
        if inserted:
            self.manager.on_insert(pool, inserted, inserted)
