"""KVReceiver: an asyncio TCP server that reassembles requests sent by KVSenders.

Chunks are received straight into the destination tensor. A bad frame (magic, checksum, limits,
shape, short read) closes only its connection and fails, with that typed error, the requests
that were in flight on it; the server keeps serving. Between frames an idle connection may wait
`idle_timeout_s` (None: forever, a pooled link is not a transfer); once a frame has begun, or
while a request is open on the connection, every read is bounded by `frame_timeout_s`.
`wait_request` is the consumer's side: it returns the `ReceivedKV` or raises the request's error.
With `tls` (a server ssl.SSLContext that requires client certificates) every connection must
complete a TLS handshake first, and `accept_peer(name)` may refuse a certificate's name; a
refused peer is logged with its address and counted in `stats.tls_refused`. Payload checksums
are required on plaintext connections and optional on TLS ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from prfaas.core.errors import ConfigError, TransportError
from prfaas.transport.assembly import Assembly, ReceivedKV, fresh_buffer
from prfaas.transport.channel import Channel, TlsChannel, TlsRefused
from prfaas.transport.errors import (
    BadHeader,
    ChecksumMismatch,
    PeerAborted,
    PeerGone,
    ShortRead,
)
from prfaas.transport.sockio import recv_exactly, translate, tune, with_timeout
from prfaas.transport.wire import (
    HEADER_BYTES,
    FrameHeader,
    FrameType,
    Limits,
    checksum,
    decode_end,
    decode_header,
    trusted_request_id,
)

# (request_id, layer, name, array): called as each tensor's last byte arrives.
TensorCallback = Callable[[int, int, str, np.ndarray], None]
_RETIRED_IDS = 4096  # ids of consumed requests remembered, so late frames are dropped
log = logging.getLogger("prfaas.transport")
THREAD_MIN_BYTES = 64 * 1024  # payloads at least this big are received in a worker thread


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 0
    limits: Limits = field(default_factory=Limits)
    frame_timeout_s: float = 30.0
    idle_timeout_s: float | None = None
    backlog: int = 128

    def __post_init__(self) -> None:
        if not self.frame_timeout_s > 0:
            raise ConfigError("frame_timeout_s", self.frame_timeout_s, "must be positive")
        if self.idle_timeout_s is not None and not self.idle_timeout_s > 0:
            raise ConfigError("idle_timeout_s", self.idle_timeout_s, "must be positive or None")
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "must be 0..65535")


@dataclass(slots=True)
class _Conn:
    chan: Channel
    peer: str
    open_ids: set[int] = field(default_factory=set)  # requests with DATA here, no END yet
    current_id: int | None = None  # request of the frame being read
    head: bytearray = field(default_factory=lambda: bytearray(HEADER_BYTES))
    head_bytes: int = 0  # of the next header, already read by the payload thread


@dataclass(slots=True)
class ReceiverStats:
    received_bytes: int = 0
    received_frames: int = 0
    connections_accepted: int = 0
    connections_failed: int = 0
    tls_refused: int = 0  # handshakes failed or certificate names refused


class KVReceiver:
    def __init__(self, config: ReceiverConfig | None = None,
                 on_tensor: TensorCallback | None = None,
                 allocate: Callable[[int], np.ndarray] = fresh_buffer, *,
                 tls: ssl.SSLContext | None = None,
                 accept_peer: Callable[[str | None], bool] | None = None) -> None:
        """`allocate(nbytes)` returns the uint8 buffer a tensor is received into (default: a
        fresh numpy array); a decode worker can pass one that draws on its KV pool."""
        self.config = config or ReceiverConfig()
        self.tls, self.accept_peer = tls, accept_peer
        self.on_tensor = on_tensor
        self.allocate = allocate
        self.stats = ReceiverStats()
        self.errors: list[TransportError] = []  # every connection-closing error, in order
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._assemblies: dict[int, Assembly] = {}
        self._retired: deque[int] = deque(maxlen=_RETIRED_IDS)
        self._retired_set: set[int] = set()
        self._pool = ThreadPoolExecutor(64, "kv-recv")  # threads start on demand

    @property
    def port(self) -> int:
        if self._listener is None:
            raise TransportError("receiver not started")
        port: int = self._listener.getsockname()[1]
        return port

    async def __aenter__(self) -> KVReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lsock.bind((self.config.host, self.config.port))
        except OSError as exc:
            lsock.close()
            raise translate(exc, f"bind {self.config.host}:{self.config.port}") from exc
        lsock.listen(self.config.backlog)
        lsock.setblocking(False)
        self._listener = lsock
        self._accept_task = asyncio.create_task(self._accept_loop(lsock))

    async def close(self) -> None:
        tasks = [t for t in (self._accept_task, *self._conn_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._listener is not None:
            self._listener.close()
        for asm in self._assemblies.values():
            asm.fail(PeerGone(f"request {asm.request_id}: receiver closed"))
        self._pool.shutdown(wait=False)

    async def wait_request(self, request_id: int, timeout_s: float) -> ReceivedKV:
        """Wait for a request to complete; raises its TransportError or TransferTimeout."""
        asm = self._assembly(request_id)
        if asm is None:
            raise TransportError(f"request {request_id}: already consumed")
        await with_timeout(asm.done.wait(), timeout_s,
                           f"request {request_id}: waiting {timeout_s}s for its KV "
                           f"({asm.received_bytes} bytes received so far)")
        self._retire(request_id)
        if asm.error is not None:
            raise asm.error
        assert asm.result is not None  # done without error means complete
        return asm.result

    def _assembly(self, request_id: int) -> Assembly | None:
        if request_id in self._retired_set:
            return None
        asm = self._assemblies.get(request_id)
        if asm is None:
            asm = self._assemblies[request_id] = Assembly(request_id, self.allocate)
        return asm

    def _retire(self, request_id: int) -> None:
        self._assemblies.pop(request_id, None)
        if len(self._retired) == self._retired.maxlen:
            self._retired_set.discard(self._retired[0])
        self._retired.append(request_id)
        self._retired_set.add(request_id)

    async def _accept_loop(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, addr = await loop.sock_accept(lsock)
            tune(sock)
            self.stats.connections_accepted += 1
            task = asyncio.create_task(self._open(sock, f"{addr[0]}:{addr[1]}"))
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)

    async def _open(self, sock: socket.socket, peer: str) -> None:
        if self.tls is None:
            await self._serve(_Conn(Channel(sock), peer))
            return
        try:
            chan = await with_timeout(
                TlsChannel.open(sock, self.tls, server_side=True, peer=peer,
                                accept_name=self.accept_peer),
                self.config.frame_timeout_s, f"TLS handshake with {peer}")
        except TransportError as exc:
            self.stats.tls_refused += 1
            self.errors.append(exc if isinstance(exc, TlsRefused) else TlsRefused(str(exc)))
            log.warning("KV receiver refused %s: %s", peer, exc)
            sock.close()
            return
        await self._serve(_Conn(chan, peer))

    async def _serve(self, conn: _Conn) -> None:
        try:
            while (h := await self._read_header(conn)) is not None:
                await self._dispatch(conn, h)
                self.stats.received_frames += 1
            if conn.open_ids:
                raise PeerGone(f"connection from {conn.peer} closed with request(s) "
                               f"{sorted(conn.open_ids)} in flight")
        except (TransportError, OSError) as exc:
            err = translate(exc, f"receive from {conn.peer}")
            self.errors.append(err)
            self.stats.connections_failed += 1
            ids = conn.open_ids | ({conn.current_id} if conn.current_id is not None else set())
            for rid in ids:
                asm = self._assemblies.get(rid)
                if asm is not None:
                    asm.fail(err)
        finally:
            conn.chan.close()

    async def _read_header(self, conn: _Conn) -> FrameHeader | None:
        raw, view = conn.head, memoryview(conn.head)
        conn.current_id = None
        # Idle between requests may last; a stall while a request is open is a failed transfer.
        wait_s = self.config.frame_timeout_s if conn.open_ids else self.config.idle_timeout_s
        what = f"header from {conn.peer}"
        first, conn.head_bytes = conn.head_bytes, 0
        if first == 0:
            first = await with_timeout(conn.chan.recv_into(view), wait_s, what)
        if first == 0:
            return None
        got = first + await with_timeout(recv_exactly(conn.chan, view[first:]),
                                         self.config.frame_timeout_s, what)
        if got < HEADER_BYTES:
            raise ShortRead(f"{what}: peer closed after {got} of {HEADER_BYTES} header bytes")
        try:
            h = decode_header(raw, self.config.limits)
        except TransportError:
            conn.current_id = trusted_request_id(raw)
            raise
        conn.current_id = h.request_id
        if not h.payload_checksummed and not conn.chan.authenticated:
            raise BadHeader(f"{what}: no payload checksum on a plaintext connection")
        return h

    async def _read_payload(self, conn: _Conn, h: FrameHeader, into: memoryview) -> None:
        what = f"payload of request {h.request_id} layer {h.layer} from {conn.peer}"
        timeout_s = self.config.frame_timeout_s
        if len(into) >= THREAD_MIN_BYTES:
            loop = asyncio.get_running_loop()
            job = loop.run_in_executor(self._pool, _payload_then_peek, conn.chan, into,
                                       timeout_s, memoryview(conn.head))
            try:
                got, conn.head_bytes = await with_timeout(asyncio.shield(job), None, what)
            except asyncio.CancelledError:
                conn.chan.close()  # the thread must stop writing into `into`; it sees closed
                with contextlib.suppress(Exception):
                    await job
                raise
        else:
            got = await with_timeout(recv_exactly(conn.chan, into), timeout_s, what)
        if got < len(into):
            raise ShortRead(f"{what}: peer closed after {got} of {len(into)} bytes")
        if h.payload_checksummed and (crc := checksum(into)) != h.payload_crc:
            raise ChecksumMismatch(f"{what}: payload crc32c {crc:#010x}, header "
                                   f"says {h.payload_crc:#010x}")
        self.stats.received_bytes += HEADER_BYTES + len(into)

    async def _dispatch(self, conn: _Conn, h: FrameHeader) -> None:
        asm = self._assembly(h.request_id)
        live = asm is not None and not asm.finished
        if h.frame_type == FrameType.DATA:
            if asm is None or not live:  # late frame of a failed/consumed request: drop it
                await self._read_payload(conn, h, memoryview(bytearray(h.chunk_bytes)))
                return
            conn.open_ids.add(h.request_id)
            await self._read_payload(conn, h, asm.target(h))
            if asm.finished:  # failed while this chunk arrived (another connection, a
                return  # consumer callback): its buffers are gone, drop the chunk
            array = asm.chunk_done(h)
            if array is not None and self.on_tensor is not None:
                self._notify(asm, h, array)
            return
        payload = bytearray(h.chunk_bytes)
        await self._read_payload(conn, h, memoryview(payload))
        conn.open_ids.discard(h.request_id)
        if asm is None or not live:
            return
        if h.frame_type == FrameType.ABORT:
            reason = payload.decode(errors="replace")
            asm.fail(PeerAborted(f"request {h.request_id}: sender aborted: {reason}"))
            return
        try:
            asm.end(decode_end(payload))
        except TransportError as exc:  # request-level inconsistency: the stream is still sound
            asm.fail(exc)

    def _notify(self, asm: Assembly, h: FrameHeader, array: np.ndarray) -> None:
        assert self.on_tensor is not None
        try:
            self.on_tensor(h.request_id, h.layer, h.name, array)
        except Exception as exc:  # a consumer bug fails its request, not the link
            asm.fail(TransportError(f"request {h.request_id}: on_tensor callback raised "
                                    f"{type(exc).__name__}: {exc}"))


def _payload_then_peek(chan: Channel, into: memoryview, timeout_s: float,
                       head: memoryview) -> tuple[int, int]:
    """Worker thread: the payload, then whatever of the next header is already there (saves
    the loop a wake-up per frame)."""
    got = chan.recv_exactly_sync(into, timeout_s)
    return got, chan.try_recv_sync(head) if got == len(into) else 0
