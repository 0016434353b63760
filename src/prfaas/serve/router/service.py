"""The router: an OpenAI-compatible aiohttp service in front of the workers.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (SSE when `stream`),
`GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), `POST /tokenize` and
`POST /detokenize` (vLLM's, with the router's tokenizer). It tokenizes with the
engine backend's tokenizer (serve/engines.py: no torch here), routes with a `policy/` Router
and the `cache/` GlobalKVCacheManager (kept current by the cache deltas workers return), and
drives the workers (dispatch.py). Every
response carries a `prfaas` object (in the last chunk when streaming). Bad input -> 400 with an
OpenAI-style error object; a policy rejection -> 429; a failed request -> 502, never a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from prfaas.cache import GlobalKVCacheManager
from prfaas.policy.base import Router, make_router
from prfaas.security.apikey import api_key_middleware
from prfaas.serve.engines import EngineBackend, engine_backend
from prfaas.serve.placement import node_label
from prfaas.serve.router.backends import make_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.router.dispatch import Dispatcher, Outcome
from prfaas.serve.router.membership import Membership
from prfaas.serve.router.metrics import RouterMetrics
from prfaas.serve.router.openai_api import (
    ApiError,
    GenRequest,
    detokenize,
    load_json,
    parse,
    tokenize,
)
from prfaas.serve.router.plan import live_codec, live_plan_inputs
from prfaas.serve.router.request_log import Entry, RequestLog, has_text
from prfaas.serve.router.respond import Reply, feed, prompt_logprobs
from prfaas.serve.topology import Topology


def build_policy(topology: Topology) -> Router:
    """The topology's policy; a `+controller` one gets the planner inputs built from the
    topology's measured profile (serve/router/plan.py)."""
    args = dict(topology.policy_args)
    if topology.policy.endswith("+controller") and "plan_inputs" not in args:
        args["plan_inputs"] = live_plan_inputs(topology)
    return make_router(topology.policy, **args)


class RouterService:
    def __init__(self, topology: Topology, policy: Router | None = None, *,
                 tls: ssl.SSLContext | None = None, api_key: str | None = None,
                 engine: EngineBackend | None = None, request_log: str | None = None) -> None:
        """`tls`: the router's client context for the PrfaaS workers' HTTPS (mutual TLS);
        `api_key`: clients must send it as a Bearer token (security/apikey.py); `engine`:
        the topology's engine backend (default: the one its `engine:` names, serve/engines.py),
        which gives the model card, the tokenizer and the protocol the workers speak;
        `request_log`: a JSON Lines file the router appends one line per request to
        (router/request_log.py)."""
        engine = engine or engine_backend(topology)
        self.topology, self.engine = topology, engine
        self.config = engine.card()
        self.tls, self.api_key = tls, api_key
        self.tokenizer: Any = engine.tokenizer()
        self.policy = policy or build_policy(topology)
        self.manager = GlobalKVCacheManager(self.config.block_size_tokens)
        for w in topology.workers:
            self.manager.add_instance(w.name, w.cluster)
        # transfer predictions count what crosses the inter-DC link (its wire dtype, and its
        # codec's measured ratio until the workers report theirs)
        self.cluster = LiveCluster(topology, self.config.kv.on_wire(topology.link.wire_dtype),
                                   engine.prefill_models(),
                                   wire_prior=1.0 / live_codec(topology, engine)[1])
        self.metrics = RouterMetrics()
        # the instances' own cache events, when the engine publishes them (vLLM kv_events)
        self.cache_events = engine.cache_events(self.manager)
        self.membership = Membership(topology, self.cluster, None,
                                     on_restart=self._forget)
        self.active = 0  # requests accepted and not finished (admission.max_inflight)
        self._session: aiohttp.ClientSession | None = None
        self._dispatcher: Dispatcher | None = None
        self.request_log = RequestLog(request_log) if request_log else None

    def app(self) -> web.Application:
        middlewares = []
        if self.api_key is not None:
            middlewares.append(api_key_middleware(
                self.api_key, self.topology.security.metrics == "protected",
                lambda: self.metrics.errors.inc(status="401")))
        app = web.Application(client_max_size=64 * 2**20, middlewares=middlewares)
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat),
            web.get("/v1/models", self.models), web.get("/health", self.health),
            web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
            web.post("/link", self.link_telemetry),
            web.get("/metrics", self.prometheus),
        ])
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def _forget(self, name: str) -> None:
        """A worker restarted: its cache is empty."""
        self.manager.forget_pool(name)
        if self.cache_events is not None:
            self.cache_events.forget(name)

    async def _start(self, _: web.Application) -> None:
        # no pool limit: a long-running stream must not starve other requests of connections
        # (and with TLS: the one client context every control call to a PrfaaS worker uses)
        connector = aiohttp.TCPConnector(limit=0, ssl=self.tls if self.tls is not None else True)
        self._session = aiohttp.ClientSession(connector=connector)
        self.membership.session = self._session
        backend = make_backend(self.engine.worker_protocol, session=self._session,
                               **self.engine.worker_protocol_args())
        self._dispatcher = Dispatcher(self.topology, self.cluster, self.manager, self.policy,
                                      self._session, self.config.block_size_tokens,
                                      backend=backend, membership=self.membership)
        if self.cache_events is not None:
            # an engine's evictions need not keep a pool prefix-closed: check every block
            self._dispatcher.exact_match = True
            self.cache_events.start()
        self.membership.start()

    async def _stop(self, _: web.Application) -> None:
        if self.request_log is not None:
            self.request_log.close()
        await self.membership.stop()
        if self.cache_events is not None:
            await self.cache_events.stop()
        if self._session is not None:
            await self._session.close()

    async def link_telemetry(self, request: web.Request) -> web.Response:
        """`{capacity_gbps}`: the inter-DC link's capacity as measured outside the router
        (the emulated link's schedule reports each change here)."""
        try:
            rate = float((await request.json())["capacity_gbps"])
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"capacity_gbps: {exc}"}, status=400)
        if not rate > 0:
            return web.json_response({"error": f"capacity_gbps={rate}: must be > 0"},
                                     status=400)
        self.cluster.capacity_gbps = rate
        return web.json_response({"capacity_gbps": rate})

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "name": "router", "role": "router",
                                  "pid": os.getpid(), **node_label(),
                                  "workers": [w.name for w in self.topology.workers],
                                  "policy": self.policy.name,
                                  "degraded": self.membership.degraded,
                                  "members": self.membership.to_json()})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.config.name, "object": "model", "created": 0, "owned_by": "prfaas",
             "max_model_len": self.config.max_context_tokens}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/tokenize`: `{model, prompt}` or `{model, messages}` -> `{count,
        max_model_len, tokens}`, the ids the router counts for that completion or chat request
        (a client checks its tokenizer against the server's with it; docs/clients.md)."""
        try:
            body = load_json(await request.read())
            ids = tokenize(body, self.config.name, self.tokenizer)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        return web.json_response({"count": len(ids), "max_model_len":
                                  self.config.max_context_tokens, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/detokenize`: `{model, tokens}` -> `{prompt}`."""
        try:
            body = load_json(await request.read())
            text = detokenize(body, self.config.name, self.tokenizer)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        return web.json_response({"prompt": text})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(self._refresh_gauges),
                            content_type="text/plain", charset="utf-8")

    def _refresh_gauges(self) -> None:
        t = self.policy.threshold_tokens()
        self.metrics.threshold.set(float(t) if t is not None else -1.0)
        for name, load in self.cluster.loads.items():
            self.metrics.inflight.set(load.inflight, worker=name)
        self.metrics.link_egress.set(self.cluster.link_egress_gbps())
        self.metrics.link_pending.set(float(self.cluster.monitor.pending_bytes))
        for name, state in self.membership.states.items():
            self.metrics.worker_up.set(1.0 if state.up else 0.0, worker=name)
            self.metrics.restarts.set(float(state.restarts), worker=name)
        self.metrics.degraded.set(1.0 if self.membership.degraded else 0.0)
        self.metrics.active.set(float(self.active))
        if self.cache_events is not None:
            for name, st in self.cache_events.stats.items():
                for kind in ("stored_blocks", "removed_blocks", "cleared", "resets",
                             "unplaced_blocks", "unknown_removed"):
                    self.metrics.cache_events.set(float(getattr(st, kind)), worker=name,
                                                  kind=kind)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t0 = time.perf_counter()
        out = Outcome()
        log = Entry.start(request, chat)
        try:
            admission = self.topology.admission
            if self.active >= admission.max_inflight:
                raise ApiError(429, f"router full: {self.active} requests in flight",
                               kind="rate_limit_error", code="queue_full",
                               retry_after_s=admission.retry_after_s)
            body = load_json(await request.read())
            req = parse(body, chat, self.config.name, self.config.max_context_tokens,
                        self.tokenizer)
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            assert self._dispatcher is not None
            query, decision = self._dispatcher.route(req, rid)
            out.router_cached_tokens = dict(query.cached_tokens)
        except ApiError as exc:
            self.metrics.errors.inc(status=str(exc.status))
            self._log(log.refused(exc, time.perf_counter() - t0))
            return web.json_response(exc.body(), status=exc.status, headers=exc.headers())
        out.router_s += time.perf_counter() - t0
        self.active += 1
        log.accepted(rid, req)
        try:
            if req.stream:
                return await self._stream(request, req, rid, query, decision, out, t0, log)
            return await self._whole(req, rid, query, decision, out, t0, log)
        finally:
            self.active -= 1
            self._log(log)

    def _log(self, entry: Entry) -> None:
        if self.request_log is not None:
            self.request_log.write(entry)

    async def _whole(self, req: GenRequest, rid: str, query: Any, decision: Any, out: Outcome,
                     t0: float, log: Entry) -> web.Response:
        assert self._dispatcher is not None
        reply, first_s = Reply(req, rid), None
        try:  # aclosing: an error in `feed` still runs the attempt's cleanup now
            async with contextlib.aclosing(self._dispatcher.tokens(req, query, decision,
                                                                   out)) as events:
                async for event in events:
                    mark = time.perf_counter()
                    first_s = first_s if first_s is not None else mark - t0
                    feed(reply, event)
                    out.router_s += time.perf_counter() - mark
            reply.finish()
            body = reply.whole(reply.usage(out.cached_tokens), prompt_logprobs(req, out))
        except ApiError as exc:
            self._count(out, "error", t0, first_s, reply)
            log.finished(exc.status, out, reply, first_s, None, time.perf_counter() - t0, exc)
            return web.json_response({**exc.body(), "prfaas": out.to_json()}, status=exc.status)
        self._count(out, "ok", t0, first_s, reply)
        e2e_s = time.perf_counter() - t0
        log.finished(200, out, reply, first_s, None, e2e_s)
        body["prfaas"] = {**out.to_json(), "ttft_s": first_s, "e2e_s": e2e_s}
        return web.json_response(body)

    async def _stream(self, request: web.Request, req: GenRequest, rid: str, query: Any,
                      decision: Any, out: Outcome, t0: float, log: Entry
                      ) -> web.StreamResponse:
        assert self._dispatcher is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        reply, first_s = Reply(req, rid), None
        text_s: float | None = None  # the first chunk with text written (clients' TTFT)
        try:  # aclosing: a bad event or a client gone still runs the attempt's cleanup now
            async with contextlib.aclosing(self._dispatcher.tokens(req, query, decision,
                                                                   out)) as events:
                async for event in events:
                    mark = time.perf_counter()
                    first_s = first_s if first_s is not None else mark - t0
                    bodies = feed(reply, event)
                    chunks = [_sse(c) for c in bodies]
                    out.router_s += time.perf_counter() - mark
                    if text_s is None and any(has_text(c) for c in bodies):
                        text_s = time.perf_counter() - t0
                    for chunk in chunks:
                        await resp.write(chunk)
        except ApiError as exc:
            self._count(out, "error", t0, first_s, reply)
            log.finished(exc.status, out, reply, first_s, text_s, time.perf_counter() - t0, exc)
            await resp.write(_sse({**exc.body(), "prfaas": out.to_json()}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        closing = reply.finish()
        self._count(out, "ok", t0, first_s, reply)
        if req.include_usage:
            closing.append({**reply.chunk(None), "usage": reply.usage(out.cached_tokens)})
        e2e_s = time.perf_counter() - t0
        if text_s is None and any(has_text(c) for c in closing):
            text_s = e2e_s
        log.finished(200, out, reply, first_s, text_s, e2e_s)
        closing[-1]["prfaas"] = {**out.to_json(), "ttft_s": first_s, "e2e_s": e2e_s}
        for body in closing:
            await resp.write(_sse(body))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _count(self, out: Outcome, outcome: str, t0: float, first_s: float | None,
               reply: Reply) -> None:
        m = self.metrics
        e2e_s = time.perf_counter() - t0
        m.requests.inc(route=out.route or "none", outcome=outcome)
        m.e2e.observe(e2e_s)
        m.router_time.observe(out.router_s)
        if out.retried:
            m.retries.inc()
        if out.resumed:
            m.resumes.inc()
        if outcome != "ok":
            m.errors.inc(status="502")
            return
        link = "inter_dc" if out.route == "prfaas" else "intra"
        m.kv_bytes.inc(out.kv_bytes, link=link)
        wire = out.kv_wire_bytes
        m.kv_wire_bytes.inc(out.kv_bytes if wire is None else wire, link=link)
        m.kv_transfers.inc(out.transfers, link=link)
        m.cached_tokens.inc(out.cached_tokens)
        if first_s is not None:
            m.ttft.observe(first_s)
            steps = max((c.num_tokens for c in reply.choices), default=0)  # per sequence
            if steps > 1:
                m.tpot.observe((e2e_s - first_s) / (steps - 1))


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
