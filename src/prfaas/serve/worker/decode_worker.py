"""Decode worker (role `pd-d`): a KVReceiver for incoming KV plus an aiohttp control service.

`POST /generate` answers as NDJSON: first `ready` with the prefix this node already holds
(the router tells the prefill node to ship only the rest), then, once every layer of the
request has arrived (`KVReceiver.wait_request`, bounded by the kv timeout), it rebuilds the
cache (`Engine.import_kv` on top of its cached prefix), keeps the prompt's block-aligned prefix
in its own cache, samples the first token from the shipped logits, admits the request into the
continuous batch and streams each token with its logprob (`lp`; `top` alternatives when
`sampling.logprobs` asks). With `sampling.n` > 1 the one imported cache is forked into n
sequences (each its own seed) and token lines carry `seq`; `max_tokens` 0 imports and ends.
A failed transfer (bad frame, peer gone, timeout) ends the request with an `error` line; the
worker keeps serving. `POST /cancel` abandons a request still waiting for its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
import time
from typing import Any

from aiohttp import web

from prfaas.core.errors import ConfigError, PrfaasError, TransportError
from prfaas.engine import EngineBase, SamplingParams, SequenceKV
from prfaas.engine.sampling import Sampled
from prfaas.models.engine_config import LAYER_KINDS
from prfaas.serve.placement import node_label
from prfaas.serve.stops import StopText
from prfaas.serve.topology import Topology, WorkerSpec
from prfaas.serve.worker.batcher import Active, Batcher
from prfaas.serve.worker.kvship import read_shipped
from prfaas.serve.worker.manifest import Binding, IntegrityError, model_identity, verify
from prfaas.serve.worker.prefix_store import CacheDelta, PrefixStore
from prfaas.serve.worker.protocol import (
    ProtocolError,
    error_reply,
    get_int,
    get_tokens,
    line,
    read_body,
)
from prfaas.serve.worker.worker_metrics import worker_metrics
from prfaas.transport import KVReceiver, ReceiverConfig

log = logging.getLogger("prfaas.security")


_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty")
_INTS = ("seed", "top_k", "min_tokens")


def sampling_from(raw: object) -> tuple[SamplingParams, int, tuple[str, ...], int]:
    """The /generate `sampling` dict -> (params, n sequences, stop strings); absent keys take
    SamplingParams' defaults (greedy), so older routers' bodies keep working. The 4th value,
    `output_offset`, is how many of the prompt's last tokens a resumed request generated."""
    m = raw if isinstance(raw, dict) else {}
    try:
        kw: dict[str, Any] = {k: float(m[k]) for k in _FLOATS if m.get(k) is not None}
        kw.update({k: int(m[k]) for k in _INTS if m.get(k) is not None})
        kw["ignore_eos"] = bool(m.get("ignore_eos", False))
        kw["stop_token_ids"] = tuple(int(t) for t in m.get("stop_token_ids") or ())
        kw["logit_bias"] = tuple((int(t), float(b)) for t, b in m.get("logit_bias") or ())
        if m.get("logprobs") is not None:
            kw["logprobs"] = int(m["logprobs"])
        n = int(m.get("n", 1))
        stops = tuple(str(x) for x in m.get("stop") or ())
        offset = int(m.get("output_offset", 0))
        if not 1 <= n <= 64 or (n > 1 and offset):
            raise ValueError(f"n={n} must be in [1, 64] (1 when resuming)")
        return SamplingParams(**kw), n, stops, offset
    except (TypeError, ValueError) as exc:
        raise ProtocolError("sampling", raw, str(exc)) from exc


class DecodeWorker:
    def __init__(self, topology: Topology, spec: WorkerSpec, engine: EngineBase, *,
                 kv_tls: ssl.SSLContext | None = None) -> None:
        """`kv_tls`: a server context requiring client certificates; KV is then accepted only
        from this topology's prefill workers (their certificates' names)."""
        self.topology, self.spec, self.engine = topology, spec, engine
        self.block_size_tokens = engine.config.block_size_tokens
        self.store = PrefixStore(self.block_size_tokens, topology.cache_capacity_bytes)
        senders = frozenset(w.name for w in topology.workers if w.is_prefill)
        # KV lands in the receiver's arena, mapped at start: no allocation or page faults per
        # transfer; what the engine keeps of it (rows, states) stays its until dropped.
        self.receiver = KVReceiver(ReceiverConfig(host=spec.host, port=spec.kv_port,
                                                  frame_timeout_s=topology.timeouts.kv_s,
                                                  pretouch_arena=True),
                                   tls=kv_tls, accept_peer=senders.__contains__)
        self.model_id = model_identity(engine)
        self.integrity_failures = 0
        self.batcher = Batcher(engine, spec.max_batch)
        self._waits: dict[int, asyncio.Task[Any]] = {}
        self.kv_waiting = 0
        self.served = 0
        self.failed_transfers = 0
        # SWA layers keep only a window: a block-aligned prefix of them cannot be cut here
        self._can_cache = "S" not in engine.config.layer_pattern

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.get("/health", self.health), web.get("/status", self.status),
                        web.post("/generate", self.generate), web.post("/cancel", self.cancel),
                        web.get("/metrics", self.metrics)])
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        await self.receiver.start()
        self.batcher.start()

    async def _stop(self, _: web.Application) -> None:
        await self.batcher.stop()
        await self.receiver.close()

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "name": self.spec.name, "role": self.spec.role,
                                  "pid": os.getpid(), "kv_port": self.receiver.port,
                                  **node_label()})

    async def metrics(self, _: web.Request) -> web.Response:
        b = self.batcher
        return worker_metrics(
            {"kv": self.receiver.stats.tls_refused}, self.integrity_failures,
            gauges={"prfaas_worker_queued_requests": len(b.waiting),
                    "prfaas_worker_running_requests": len(b.running),
                    "prfaas_worker_kv_waiting_requests": self.kv_waiting},
            counters={"prfaas_kv_transfer_failures_total": self.failed_transfers})

    async def status(self, _: web.Request) -> web.Response:
        b = self.batcher
        return web.json_response({
            "name": self.spec.name, "role": self.spec.role, "cluster": self.spec.cluster,
            "running": len(b.running), "waiting": len(b.waiting), "kv_waiting": self.kv_waiting,
            "free_slots": b.free_slots, "served": self.served, "steps": b.steps,
            "mean_step_s": b.step_s_total / b.steps if b.steps else 0.0,
            "failed_transfers": self.failed_transfers,
            "integrity_failures": self.integrity_failures,
            "tls_refused": self.receiver.stats.tls_refused,
            "received_bytes": self.receiver.stats.received_bytes,
            "cache": {"entries": self.store.num_entries, "used_bytes": self.store.used_bytes,
                      "hits": self.store.hits, "misses": self.store.misses},
        })

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            rid = get_int(await read_body(request), "request_id")
        except ProtocolError as exc:
            return error_reply(400, "bad_request", str(exc))
        task = self._waits.get(rid)
        if task is not None:
            task.cancel()
        return web.json_response({"cancelled": task is not None})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_body(request)
            rid = get_int(body, "request_id")
            token_ids = get_tokens(body)
            max_tokens = get_int(body, "max_tokens", minimum=0)
            params, n, stops, offset = sampling_from(body.get("sampling"))
            if offset >= len(token_ids):
                raise ProtocolError("sampling.output_offset", offset, "must be below the "
                                    f"prompt length {len(token_ids)}")
        except ProtocolError as exc:
            return error_reply(400, "bad_request", str(exc))
        prefix = self.store.lookup(token_ids, len(token_ids) - 1) if self._can_cache else None
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        nonce = secrets.token_hex(16)  # this attempt's challenge: the manifest must echo it
        await resp.write(line({"event": "ready", "nonce": nonce,
                               "cached_tokens": prefix.num_tokens if prefix else 0}))
        try:
            actives, info = await self._admit(rid, token_ids, prefix, max_tokens, params, n,
                                              stops, nonce, offset)
        except (PrfaasError, asyncio.CancelledError) as exc:
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task and task.cancelling():
                raise  # this handler itself is being cancelled (shutdown), not just the wait
            if isinstance(exc, TransportError):
                self.failed_transfers += 1
            if isinstance(exc, IntegrityError):
                self.integrity_failures += 1
                log.warning("refused the KV of request %d: %s", rid, exc)
            msg = "cancelled" if isinstance(exc, asyncio.CancelledError) else str(exc)
            with contextlib.suppress(ConnectionError):
                await resp.write(line({"event": "error", "message": msg,
                                       "type": type(exc).__name__}))
            return resp
        await self._stream(resp, actives, info)
        return resp

    async def _admit(self, rid: int, token_ids: list[int], prefix: SequenceKV | None,
                     max_tokens: int, params: SamplingParams, n: int, stops: tuple[str, ...],
                     nonce: str, offset: int = 0) -> tuple[list[Active], dict[str, Any]]:
        t0 = time.perf_counter()
        self.kv_waiting += 1
        wait = asyncio.create_task(self.receiver.wait_request(rid, self.topology.timeouts.kv_s))
        self._waits[rid] = wait
        try:
            received = await wait
        finally:
            self.kv_waiting -= 1
            self._waits.pop(rid, None)
        t_kv = time.perf_counter()
        kv_ready_unix_s = time.time()  # wall clock: comparable across processes of a host
        binding = Binding(rid, nonce, self.model_id, self.engine.config.layer_pattern,
                          prefix.num_tokens if prefix else 0, tuple(token_ids))
        await asyncio.to_thread(verify, received, binding, LAYER_KINDS)  # before admitting
        shipped = read_shipped(received, self.engine.config.num_layers)
        try:
            kv = self.engine.import_kv(shipped.layers, prefix, token_ids)
        except ConfigError as exc:
            raise TransportError(f"request {rid}: received KV does not fit: {exc}") from exc
        delta = self._keep_prefix(kv, token_ids, shipped.snap_at, shipped.snapshots)
        events: asyncio.Queue[tuple[int, Sampled | str]] = asyncio.Queue()
        actives = []
        for i in range(n if max_tokens > 0 else 0):
            own = kv if i == 0 else kv.snapshot_at(kv.num_tokens)  # a fork shares full blocks
            seq = self.engine.start(own, shipped.logits, params.for_sequence(i), token_ids,
                                    offset)
            active = Active(seq, max_tokens, events=events, index=i,
                            stops=_stop_text(stops, params.min_tokens, token_ids, offset))
            assert seq.last is not None
            if not active.offer(seq.last, self.engine.tokenizer.eos_id):
                self.batcher.admit(active)
            actives.append(active)
        info = {"kv_wait_s": t_kv - t0, "kv_ready_unix_s": kv_ready_unix_s,
                "kv_bytes_received": shipped.num_bytes,
                "kv_verify_s": time.perf_counter() - t_kv,
                "cache": delta.to_json()}
        return actives, info

    def _keep_prefix(self, kv: SequenceKV, token_ids: list[int], snap_at: int,
                     snapshots: dict[int, dict[str, Any]]) -> CacheDelta:
        """Cache the prompt's block-aligned prefix before decoding extends the sequence."""
        if not self._can_cache:
            return CacheDelta()
        for layer, state in snapshots.items():
            # the engine's LinearStore keeps snapshots by length; the shipped one is exact
            placed = self.engine.place_state(state)
            kv.stores[layer].snapshots[snap_at] = placed  # type: ignore[union-attr]
        boundaries = [b for b in range(1, len(token_ids) // self.block_size_tokens + 1)
                      if _has_state_at(kv, b * self.block_size_tokens)]
        return self.store.insert(kv, token_ids, boundaries)

    async def _stream(self, resp: web.StreamResponse, actives: list[Active],
                      info: dict[str, Any]) -> None:
        reasons: dict[int, str] = {}
        many = len(actives) > 1
        try:
            while len(reasons) < len(actives):
                index, event = await actives[0].events.get()
                if isinstance(event, Sampled):
                    out: dict[str, Any] = {"event": "token", "id": event.token,
                                           "lp": event.logprob}
                    if event.top:
                        out["top"] = [list(p) for p in event.top]
                    if many:
                        out["seq"] = index
                    await resp.write(line(out))
                elif event.startswith("error"):
                    await resp.write(line({"event": "error", "message": event}))
                    for a in actives:
                        a.cancelled = True
                    return
                else:
                    reasons[index] = event
            self.served += 1
            ordered = [reasons[i] for i in range(len(actives))] or ["length"]
            await resp.write(line({"event": "done", "finish_reason": ordered[0],
                                   "finish_reasons": ordered,
                                   "num_tokens": sum(a.emitted for a in actives), **info}))
        except (ConnectionError, asyncio.CancelledError):
            for a in actives:
                a.cancelled = True  # the router went away: free the batch slots
            raise


def _stop_text(stops: tuple[str, ...], min_tokens: int, token_ids: list[int], offset: int
               ) -> StopText | None:
    """The stop matcher, already fed a resumed request's earlier output."""
    if not stops:
        return None
    text = StopText(stops, min_tokens)
    for token in token_ids[len(token_ids) - offset:]:
        text.feed(token)
    return text


def _has_state_at(kv: SequenceKV, num_tokens: int) -> bool:
    for store in kv.stores:
        snapshots = getattr(store, "snapshots", None)
        if snapshots is not None and num_tokens not in snapshots and store.num_tokens != num_tokens:
            return False
    return True
