"""prfaas.transport inside a vLLM worker process: a sender thread and a receiver thread.

vLLM calls the connector from its forward loop (plain threads, no event loop); prfaas.transport
is asyncio. Each side runs its own event loop in a daemon thread:
- `SendLink.submit(dest, item)` queues a tensor, an END or an ABORT for one transfer and returns
  at once (the forward goes on with the next layer); one ordered queue and one `KVSender`
  (N TCP connections, the shaped link's token bucket) per destination. A broken connection
  fails the transfers that used it and the next transfer reconnects. A `Staged` item is a
  tensor still on its way off the device: its `resolve` runs in a thread beside the sender
  (waits for the copy, converts, digests for the manifest) and gives the tensors that travel;
  when it raises, the transfer fails whole: an ABORT goes to the receiver, never its END.
- `RecvLink` runs a `KVReceiver`; every complete tensor goes to `on_tensor` (in the receiver's
  thread) and every expected transfer ends as one `Result` (ok, or the transport's error).
A finished transfer's `Result.wire_bytes` is what crossed the link (DATA payload bytes,
compressed where they were): the sender's `finish` count on one side, the receiver's on the other.
Both keep results in thread-safe lists that the connector drains once per engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from prfaas.core.errors import TransportError
from prfaas.transport.errors import ConnectFailed
from prfaas.transport.receiver import KVReceiver, ReceiverConfig
from prfaas.transport.sender import KVSender, SenderConfig

Dest = tuple[str, int]
Route = tuple[str, int, float | None]  # a destination and the link rate to it (None: default)


@dataclass(frozen=True, slots=True)
class Tensor:
    transfer_id: int
    layer: int
    name: str
    array: np.ndarray  # contiguous; bf16 travels as uint16 words with bfloat16=True
    bfloat16: bool = False


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Staged:
    transfer_id: int
    resolve: Callable[[], list[Tensor]]  # beside the sender: may wait, may raise
    discard: Callable[[], None] = _nothing  # its transfer failed: give its memory back unread


@dataclass(frozen=True, slots=True)
class Finish:
    transfer_id: int
    # travels in the END frame (kv_security.py); a callable is encoded beside the sender, once
    # every tensor queued before it was digested
    manifest: bytes | Callable[[], bytes] = b""


@dataclass(frozen=True, slots=True)
class Abort:
    transfer_id: int
    reason: str


Item = Tensor | Staged | Finish | Abort


@dataclass(frozen=True, slots=True)
class Result:
    transfer_id: int
    error: str | None  # None: every frame sent (sender) / received and complete (receiver)
    done_s: float  # time.monotonic() at the end: one clock for every process of a host
    first_s: float | None = None  # first tensor queued (sender) / first byte in (receiver)
    manifest: bytes = b""  # (receiver) what the sender's END carried
    # DATA payload bytes that crossed the link (compressed where they were): what the sender's
    # `finish` returned / the receiver counted; None: the transfer failed
    wire_bytes: int | None = None


class _Loop:
    """An asyncio loop in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self._results: list[Result] = []
        self._lock = threading.Lock()

    def push(self, result: Result) -> None:
        with self._lock:
            self._results.append(result)

    def drain(self) -> list[Result]:
        with self._lock:
            out, self._results = self._results, []
        return out

    def stop(self) -> None:
        if self.loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class SendLink(_Loop):
    def __init__(self, config: SenderConfig, tls: ssl.SSLContext | None = None,
                 peer_name: Callable[[str, int], str | None] | None = None) -> None:
        """`tls`: every connection is TLS and `peer_name(host, port)` names the certificate
        the destination must show; a destination it names None is refused without a byte."""
        super().__init__("prfaas-kv-send")
        self.config = config
        self.tls, self.peer_name = tls, peer_name
        self._queues: dict[Route, asyncio.Queue[Item]] = {}
        self._first: dict[int, float] = {}

    def submit(self, dest: Dest, item: Item, rate_gbps: float | None = None) -> None:
        """Thread-safe and non-blocking; items of one destination go out in submit order.
        `rate_gbps`: a link rate other than the configured one (its own sender)."""
        if isinstance(item, Tensor | Staged):
            self._first.setdefault(item.transfer_id, time.monotonic())
        self.loop.call_soon_threadsafe(self._put, (dest[0], dest[1], rate_gbps), item)

    def _put(self, route: Route, item: Item) -> None:
        queue = self._queues.get(route)
        if queue is None:
            queue = self._queues[route] = asyncio.Queue()
            self.loop.create_task(self._pump(route, queue))
        queue.put_nowait(item)

    async def _pump(self, route: Route, queue: asyncio.Queue[Item]) -> None:
        dest = (route[0], route[1])
        config = self.config if route[2] is None else replace(self.config, rate_gbps=route[2])
        sender: KVSender | None = None
        failed: dict[int, str] = {}  # transfer -> why; later items of it are dropped
        open_tids: set[int] = set()  # transfers with an item on the current sender
        while True:
            item = await queue.get()
            tid = item.transfer_id
            if isinstance(item, Staged):
                staged = await self._resolve(item, failed)
                if staged is None:  # failed now or before: the receiver was told, or will be
                    if tid in failed and sender is not None and tid in open_tids:
                        open_tids.discard(tid)
                        with contextlib.suppress(TransportError):
                            await sender.abort(tid, failed[tid])
                    continue
                items: list[Item] = list(staged)
            else:
                items = [item]
            for one in items:
                sender = await self._one(one, dest, config, sender, failed, open_tids)

    async def _resolve(self, item: Staged, failed: dict[int, str]) -> list[Tensor] | None:
        """The staged tensors (in a thread: it waits for the device); None when the transfer
        failed (before: its memory is given back unread; now: `failed` says why)."""
        tid = item.transfer_id
        if tid in failed:
            await asyncio.to_thread(item.discard)
            return None
        try:
            return await asyncio.to_thread(item.resolve)
        except Exception as exc:  # a device copy or a conversion failed: the transfer fails
            failed[tid] = f"{type(exc).__name__}: {exc}"
            return None

    async def _one(self, item: Item, dest: Dest, config: SenderConfig, sender: KVSender | None,
                   failed: dict[int, str], open_tids: set[int]) -> KVSender | None:
        """Send one item on the destination's sender (opened or replaced as needed); returns
        the sender to use next."""
        tid = item.transfer_id
        try:
            if tid in failed:
                if not isinstance(item, Tensor):
                    self._end(tid, failed.pop(tid))
                return sender
            if sender is not None and tid not in open_tids and sender.peer_closed():
                # the receiver went away since the last transfer (a decoder restarted on
                # the same port): a new transfer starts on new connections; the open ones
                # had their frames on the old, so they fail
                for other in open_tids:
                    failed[other] = f"PeerGone: {dest[0]}:{dest[1]} closed the connection"
                open_tids.clear()
                await sender.close()
                sender = None
            if sender is None:
                sender = self._sender(dest, config)
                await sender.connect()
            open_tids.add(tid)
            if isinstance(item, Tensor):
                await sender.send_array(tid, item.layer, "gqa", item.name, item.array,
                                        bfloat16=item.bfloat16)
            elif isinstance(item, Finish):
                open_tids.discard(tid)
                manifest = item.manifest() if callable(item.manifest) else item.manifest
                wire = await sender.finish(tid, manifest=manifest)
                self._end(tid, None, wire)
            elif isinstance(item, Abort):
                open_tids.discard(tid)
                await sender.abort(tid, item.reason)
                self._end(tid, f"aborted: {item.reason}")
        except TransportError as exc:
            failed[tid] = f"{type(exc).__name__}: {exc}"
            for other in open_tids - {tid}:  # their frames were on the closed connections
                failed[other] = failed[tid]
            open_tids.clear()
            if sender is not None:
                await sender.close()
                sender = None
            if not isinstance(item, Tensor):
                self._end(tid, failed.pop(tid))
        return sender

    def _sender(self, dest: Dest, config: SenderConfig) -> KVSender:
        if self.tls is None:
            return KVSender(dest[0], dest[1], config)
        name = self.peer_name(*dest) if self.peer_name is not None else None
        if name is None:
            raise ConnectFailed(f"{dest[0]}:{dest[1]} is not the KV port of a decoder of this "
                                "topology: nothing sent")
        return KVSender(dest[0], dest[1], config, tls=self.tls, server_name=name)

    def _end(self, tid: int, error: str | None, wire_bytes: int | None = None) -> None:
        self.push(Result(tid, error, time.monotonic(), self._first.pop(tid, None),
                         wire_bytes=wire_bytes))


class RecvLink(_Loop):
    def __init__(self, config: ReceiverConfig,
                 on_tensor: Callable[[int, int, str, np.ndarray], None],
                 tls: ssl.SSLContext | None = None,
                 accept_peer: Callable[[str | None], bool] | None = None) -> None:
        super().__init__("prfaas-kv-recv")
        # tensors land in the receiver's arena (mapped at start, reused across transfers);
        # `on_tensor` copies what it keeps, so each slice is free again when it returns
        self.receiver = KVReceiver(replace(config, pretouch_arena=True), on_tensor=on_tensor,
                                   tls=tls, accept_peer=accept_peer)
        asyncio.run_coroutine_threadsafe(self.receiver.start(), self.loop).result(timeout=10)
        self._waits: dict[int, asyncio.Task[None]] = {}

    def expect(self, transfer_id: int, timeout_s: float) -> None:
        """Start waiting for a transfer; its Result arrives in `drain()`."""
        self.loop.call_soon_threadsafe(self._expect, transfer_id, timeout_s)

    def forget(self, transfer_id: int) -> None:
        """Stop waiting (the request was aborted); no Result is reported for it."""
        self.loop.call_soon_threadsafe(self._forget, transfer_id)

    def _expect(self, tid: int, timeout_s: float) -> None:
        if tid not in self._waits:
            self._waits[tid] = self.loop.create_task(self._wait(tid, timeout_s))

    def _forget(self, tid: int) -> None:
        task = self._waits.pop(tid, None)
        if task is not None:
            task.cancel()

    async def _wait(self, tid: int, timeout_s: float) -> None:
        try:
            kv = await self.receiver.wait_request(tid, timeout_s)
            self.push(Result(tid, None, time.monotonic(), kv.first_byte_s, kv.manifest,
                             kv.wire_bytes))
        except TransportError as exc:
            self.push(Result(tid, f"{type(exc).__name__}: {exc}", time.monotonic()))
        finally:
            self._waits.pop(tid, None)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.receiver.close(), self.loop).result(timeout=5)
        super().stop()
