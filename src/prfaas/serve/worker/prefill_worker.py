"""Prefill worker (role `prfaas` or `pd-p`): an aiohttp service around one Engine.

A `POST /prefill` waits for the engine (one prefill at a time, like one GPU), looks up its own
prefix cache, runs `Engine.prefill` in a thread (torch releases the GIL) and streams each
layer's KV to the decode worker's KVReceiver as soon as the layer is done (the hook hands the
layer to the event loop thread-safely; the loop sends while the thread computes the next
layer). Computed = tokens this node does not hold; shipped = tokens the decode node does not
hold (`ship_from_tokens`). One KVSender per destination is kept open and reused; a failed one
is dropped and the request answered 502, so the router can retry on the local path. The KV
tail after the compute must be delivered within the request's `kv_deadline_s` (the router
derives it from the predicted transfer time), so a partitioned link costs seconds. The link
(shaped for `prfaas`, intra-cluster for `pd-p`) comes from the topology.
A layer leaves the engine's device through a LayerShipper (engine/shipper.py): on a GPU the
hook only issues the copies and the event loop's pump waits for them in a thread, so the
model thread never waits on a copy or the network; a copy that fails fails the request (502),
never a partial KV. Its counters are in /status (`shipper`) and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from prfaas.core.errors import ConfigError, TransportError
from prfaas.engine import EngineBase, LayerKV, SequenceKV
from prfaas.engine.device_ops import device_ops
from prfaas.engine.sampling import MAX_LOGPROBS, prompt_logprobs
from prfaas.engine.shipper import LayerShipper
from prfaas.serve.placement import node_label
from prfaas.serve.topology import Topology, WorkerSpec
from prfaas.serve.worker.kvship import ShippedLayer, meta_arrays, reframe, ship_layer
from prfaas.serve.worker.manifest import Binding, ManifestBuilder, model_identity
from prfaas.serve.worker.prefix_store import PrefixStore
from prfaas.serve.worker.protocol import ProtocolError, error_reply, get_int, get_tokens, read_body
from prfaas.serve.worker.tls_server import Refusals
from prfaas.serve.worker.worker_metrics import worker_metrics
from prfaas.transport import KVSender, LinkMonitor, SenderConfig

_EWMA = 0.3


class PrefillWorker:
    def __init__(self, topology: Topology, spec: WorkerSpec, engine: EngineBase, *,
                 kv_tls: ssl.SSLContext | None = None) -> None:
        """`kv_tls`: this worker's client context for the decode workers' KV receivers."""
        self.topology, self.spec, self.engine = topology, spec, engine
        self.kv_tls = kv_tls
        self.model_id = model_identity(engine)
        self.http_refusals = Refusals()  # peers refused at its HTTPS handshake (deploy/proc.py)
        self.block_size_tokens = engine.config.block_size_tokens
        self.store = PrefixStore(self.block_size_tokens, topology.cache_capacity_bytes)
        self.link = topology.link_of(spec)
        self.monitor = LinkMonitor()
        self._senders: dict[tuple[str, int], KVSender] = {}
        self._connecting = asyncio.Lock()
        self._engine_lock = asyncio.Lock()
        self.queued = 0
        self.running = 0
        self.served = 0
        self.failed_transfers = 0
        self.seconds_per_token = 0.0  # EWMA of measured prefill time per computed token
        # the engine's device (CPU engines have none: the copies then run at once)
        self.shipper = LayerShipper(device_ops(getattr(engine, "device", None)))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.get("/health", self.health), web.get("/status", self.status),
                        web.post("/prefill", self.prefill),
                        web.get("/metrics", self.metrics)])
        app.on_cleanup.append(self._close)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "name": self.spec.name, "role": self.spec.role,
                                  "pid": os.getpid(), **node_label()})

    async def metrics(self, _: web.Request) -> web.Response:
        sample = self.monitor.sample()
        return worker_metrics(
            {"http": self.http_refusals.count},
            gauges={"prfaas_worker_queued_requests": self.queued,
                    "prfaas_worker_running_requests": self.running},
            counters={"prfaas_kv_transfer_failures_total": self.failed_transfers,
                      "prfaas_kv_sent_bytes_total": sample.total_sent_bytes,
                      "prfaas_kv_tcp_retransmits_total": sample.retransmits},
            shipper=self.shipper.metrics.as_dict())

    async def status(self, _: web.Request) -> web.Response:
        sample = self.monitor.sample()
        return web.json_response({
            "name": self.spec.name, "role": self.spec.role, "cluster": self.spec.cluster,
            "queued": self.queued, "running": self.running, "served": self.served,
            "failed_transfers": self.failed_transfers,
            "seconds_per_token": self.seconds_per_token,
            "shipper": {"device": self.shipper.ops.name, **self.shipper.metrics.as_dict()},
            "cache": {"entries": self.store.num_entries, "used_bytes": self.store.used_bytes,
                      "hits": self.store.hits, "misses": self.store.misses},
            "link": {"rate_gbps": self.link.rate_gbps, "connections": self.link.connections,
                     "compression": self.link.compression, "codecs": self._codecs(),
                     "egress_bytes_per_s": sample.egress_bytes_per_s,
                     "pending_bytes": sample.pending_bytes, "retransmits": sample.retransmits,
                     "sent_bytes": sample.total_sent_bytes},
        })

    async def prefill(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_body(request)
            rid = get_int(body, "request_id")
            token_ids = get_tokens(body)
            ship_from = get_int(body, "ship_from_tokens", default=0)
            prompt_k = _prompt_logprobs(body.get("prompt_logprobs"))
            deadline_s = _positive_float(body.get("kv_deadline_s", self.topology.timeouts.kv_s))
            dest = body.get("dest")
            if not isinstance(dest, dict) or not isinstance(dest.get("host"), str):
                raise ProtocolError("dest", dest, "must be {host, port}")
            port = get_int(dest, "port", minimum=1)
            if ship_from % self.block_size_tokens or ship_from >= len(token_ids):
                raise ProtocolError("ship_from_tokens", ship_from,
                                    f"must be a multiple of {self.block_size_tokens} below "
                                    f"the prompt length {len(token_ids)}")
        except ProtocolError as exc:
            return error_reply(400, "bad_request", str(exc))
        # `progress`: an NDJSON reply whose first line `{"event": "computed"}` is written when
        # the engine is free again (the compute is done; the KV tail may still be crossing),
        # then one line with the reply or {"error": ..., "status": N}. The PrfaaS tenant
        # gateway (serve/gateway.py) uses it to give the engine its next job at once.
        stream: web.StreamResponse | None = None

        async def computed() -> None:
            nonlocal stream
            if body.get("progress") is True:
                stream = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await stream.prepare(request)
                await stream.write(b'{"event": "computed"}\n')

        try:
            nonce = body.get("nonce") or ""
            if not isinstance(nonce, str):
                raise ProtocolError("nonce", nonce, "must be the decoder's challenge string")
            reply = await self._run(rid, token_ids, ship_from, (dest["host"], port), deadline_s,
                                    nonce, prompt_k, computed)
        except ProtocolError as exc:
            return await _answer(stream, error_reply(400, "bad_request", str(exc)))
        except ConfigError as exc:
            return await _answer(stream, error_reply(400, "bad_request", str(exc)))
        except TransportError as exc:
            self.failed_transfers += 1
            await self._drop_sender((dest["host"], port))
            return await _answer(stream, error_reply(502, "transfer_failed",
                                                     f"{type(exc).__name__}: {exc}"))
        return await _answer(stream, web.json_response(reply))

    async def _run(self, rid: int, token_ids: list[int], ship_from: int,
                   dest: tuple[str, int], deadline_s: float, nonce: str,
                   prompt_k: int | None = None,
                   on_computed: Callable[[], Awaitable[None]] | None = None
                   ) -> dict[str, Any]:
        t_arrive = time.perf_counter()
        sender = await self._sender(dest)
        builder = ManifestBuilder(Binding(rid, nonce, self.model_id,
                                          self.engine.config.layer_pattern, ship_from,
                                          tuple(token_ids)))
        self.queued += 1
        async with self._engine_lock:
            self.queued -= 1
            self.running = 1
            t_start = time.perf_counter()
            try:
                # prompt logprobs need every position's logits: no cached prefix then
                prefix = (self.store.lookup(token_ids, len(token_ids) - 1)
                          if prompt_k is None else None)
                result, pump = await self._compute(rid, token_ids, ship_from, prefix, sender,
                                                   builder, prompt_k is not None)
            finally:
                self.running = 0
        t_computed = time.perf_counter()
        if on_computed is not None:
            await on_computed()
        try:  # the tail of the layer stream, outside the engine lock, within the KV deadline
            kv_bytes, wire_bytes = await asyncio.wait_for(
                self._tail(pump, sender, builder, rid, result, ship_from, len(token_ids)),
                deadline_s)
        except TimeoutError as exc:
            pump.cancel()
            raise TransportError(f"request {rid}: KV not delivered within its deadline "
                                 f"({deadline_s:.1f} s after the prefill)") from exc
        t_done = time.perf_counter()
        delta = self.store.insert(result.kv, token_ids)
        computed = result.num_computed_tokens
        per_token = (t_computed - t_start) / max(computed, 1)
        self.seconds_per_token = (per_token if not self.served else
                                  (1 - _EWMA) * self.seconds_per_token + _EWMA * per_token)
        self.served += 1
        return {"first_token": result.first_token, "cached_tokens": len(token_ids) - computed,
                "computed_tokens": computed, "shipped_tokens": len(token_ids) - ship_from,
                "kv_bytes": kv_bytes, "kv_wire_bytes": wire_bytes, "queue_s": t_start - t_arrive,
                "prefill_s": t_computed - t_start, "transfer_tail_s": t_done - t_computed,
                "cache": delta.to_json(),
                **_prompt_reply(token_ids, result.prompt_logits, prompt_k)}

    async def _tail(self, pump: asyncio.Task[int], sender: KVSender, builder: ManifestBuilder,
                    rid: int, result: Any, ship_from: int, num_tokens: int) -> tuple[int, int]:
        """The KV's tensor bytes and its bytes on the wire (less with link.compression)."""
        kv_bytes = await pump
        kv_bytes += await self._send_meta(sender, builder, rid, result.kv, result.logits,
                                          ship_from, num_tokens)
        wire_bytes = await sender.finish(rid, self.topology.timeouts.kv_s,
                                         manifest=await builder.encode())
        return kv_bytes, wire_bytes

    async def _compute(self, rid: int, token_ids: list[int], ship_from: int,
                       prefix: SequenceKV | None, sender: KVSender, builder: ManifestBuilder,
                       all_logits: bool = False
                       ) -> tuple[Any, asyncio.Task[int]]:
        loop = asyncio.get_running_loop()
        layers: asyncio.Queue[ShippedLayer | None] = asyncio.Queue()

        def hook(layer: LayerKV) -> None:  # prefill thread
            shipped = reframe(layer, ship_from, prefix)
            # off the device without waiting; encoded (fp8 / bf16 on the wire) here when the
            # bytes are on the host already, else by the pump's thread: off the event loop
            item = ship_layer(self.shipper, rid, shipped, self.link.wire_dtype)
            loop.call_soon_threadsafe(layers.put_nowait, item)

        def forward() -> Any:  # prefill thread
            try:
                return self.engine.prefill(token_ids, prefix, hook, all_logits)
            finally:  # the compute stream waits for the gathers; deferred layers may go
                self.shipper.end_step()
                self.shipper.end_request(rid)

        pump = asyncio.create_task(self._pump(sender, builder, rid, layers))
        try:
            result = await asyncio.to_thread(forward)
        except BaseException:
            layers.put_nowait(None)
            with contextlib.suppress(TransportError):
                await pump
            raise
        layers.put_nowait(None)  # after every hook callback: call_soon_threadsafe is FIFO
        return result, pump

    async def _pump(self, sender: KVSender, builder: ManifestBuilder, rid: int,
                    layers: asyncio.Queue[ShippedLayer | None]) -> int:
        sent = 0
        failure: TransportError | None = None
        try:
            while (item := await layers.get()) is not None:
                if failure is not None:  # the request failed: its later layers go unread
                    await asyncio.to_thread(item.discard)
                    continue
                try:
                    await self._ship_layer(sender, builder, rid, item)
                    sent += sum(a.nbytes for _, a in item.ready or [])
                except TransportError as exc:  # (ShipError: a device copy failed)
                    failure = exc
        finally:  # cancelled (KV deadline): what is queued gives its host memory back
            while not layers.empty():
                left = layers.get_nowait()
                if left is not None:
                    asyncio.get_running_loop().run_in_executor(None, left.discard)
        if failure is not None:
            raise failure
        return sent

    async def _ship_layer(self, sender: KVSender, builder: ManifestBuilder, rid: int,
                          item: ShippedLayer) -> None:
        if item.ready is None:
            item.ready = await asyncio.to_thread(item.arrays, self.link.wire_dtype)
        layer = item.layer
        for name, array in item.ready:
            await _ship(sender, builder, rid, layer.layer_index, layer.kind, name, array)

    async def _send_meta(self, sender: KVSender, builder: ManifestBuilder, rid: int,
                         kv: SequenceKV, logits: Any, ship_from: int, num_tokens: int) -> int:
        """Snapshots, logits and snap_at (kvship.meta_arrays)."""
        sent = 0
        for layer, kind, name, array in meta_arrays(kv, logits, ship_from, num_tokens,
                                                    self.block_size_tokens):
            await _ship(sender, builder, rid, layer, kind, name, array)
            sent += array.nbytes
        return sent

    async def _sender(self, dest: tuple[str, int]) -> KVSender:
        async with self._connecting:
            sender = self._senders.get(dest)
            if sender is None:
                t = self.topology.timeouts
                config = SenderConfig(num_connections=self.link.connections,
                                      rate_gbps=self.link.sender_rate_gbps,
                                      compression=self.link.compression,
                                      link_rate_gbps=self.link.rate_gbps,
                                      connect_timeout_s=t.connect_s, io_timeout_s=t.kv_s,
                                      finish_timeout_s=t.kv_s)
                sender = KVSender(dest[0], dest[1], config, self.monitor, tls=self.kv_tls,
                                  server_name=self._decoder_name(dest))
                await sender.connect()
                self._senders[dest] = sender
            return sender

    def _codecs(self) -> dict[str, str | None]:
        """Each open sender's codec (what `compression: auto` chose; None: undecided)."""
        return {f"{h}:{p}": s.codec for (h, p), s in self._senders.items()}

    def _decoder_name(self, dest: tuple[str, int]) -> str | None:
        """The topology name of the decode worker at `dest` (its certificate must carry it).
        With TLS only the topology's decode workers are sent KV."""
        for w in self.topology.by_role("pd-d"):
            if self.topology.kv_dest(self.spec, w) == dest:  # (or its delay-stage copy)
                return w.name
        if self.kv_tls is not None:
            raise ProtocolError("dest", f"{dest[0]}:{dest[1]}",
                                "not the KV port of a decode worker of this topology")
        return None

    async def _drop_sender(self, dest: tuple[str, int]) -> None:
        sender = self._senders.pop(dest, None)
        if sender is not None:
            await sender.close()

    async def _close(self, _: web.Application) -> None:
        for dest in list(self._senders):
            await self._drop_sender(dest)


async def _answer(stream: web.StreamResponse | None, reply: web.Response) -> web.StreamResponse:
    """`reply` as is, or as the last line of a progress stream already begun."""
    if stream is None:
        return reply
    body = json.loads(reply.text or "{}")
    if reply.status != 200:
        body = {**body, "status": reply.status}
    await stream.write(json.dumps(body).encode() + b"\n")
    await stream.write_eof()
    return stream


async def _ship(sender: KVSender, builder: ManifestBuilder, rid: int, layer: int, kind: str,
                name: str, array: np.ndarray) -> None:
    builder.add(layer, name, array)
    await sender.send_array(rid, layer, kind, name, array, bfloat16=array.dtype == np.uint16)


def _positive_float(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw > 0:
        raise ProtocolError("kv_deadline_s", raw, "must be a number > 0")
    return float(raw)


def _prompt_logprobs(raw: object) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_LOGPROBS:
        raise ProtocolError("prompt_logprobs", raw, f"must be an integer in [0, {MAX_LOGPROBS}]")
    return raw


def _prompt_reply(token_ids: list[int], logits: Any, k: int | None) -> dict[str, Any]:
    """`prompt_logprobs`: [logprob, [[id, logprob], ...]] of prompt tokens 1.. (echo). A
    request asking for them (`prompt_logprobs`: k) is prefilled from scratch, so every
    position's logits exist; they are the same as a resumed prefill's (engine exactness)."""
    if k is None or logits is None:
        return {}
    return {"prompt_logprobs": [[s.logprob, [list(p) for p in s.top]]
                                for s in prompt_logprobs(token_ids, logits, k)]}
