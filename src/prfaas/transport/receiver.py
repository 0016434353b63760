"""KVReceiver: an asyncio TCP server that reassembles requests sent by KVSenders.

Chunks are received straight into the destination tensor, carved from the receiver's arena
(transport/arena.py: one buffer reused across transfers, a slice reused only once no array
views it). Payloads of 64 KiB or more are received by a worker thread per connection, which
checks each payload's CRC and, while a request is open on the connection, waits for the next
header itself and goes on to it without the loop when it is a DATA frame of a live request; the
loop hands out tensors (`on_tensor`, on the loop's thread) and handles END and ABORT. A bad
frame (magic, checksum, limits, shape, short read) closes only its connection and fails, with
that typed error, the requests that were in flight on it; the server keeps serving. Between
frames an idle connection may wait `idle_timeout_s` (None: forever, a pooled link is not a
transfer); once a frame has begun, or while a request is open on the connection, every read is
bounded by `frame_timeout_s`.
`wait_request` is the consumer's side: it returns the `ReceivedKV` or raises the request's error;
its `wire_bytes` are the request's DATA payload bytes as they crossed (what the sender's
`finish` returned), `num_bytes` its tensors' bytes.
With `tls` (a server ssl.SSLContext that requires client certificates) every connection must
complete a TLS handshake first, and `accept_peer(name)` may refuse a certificate's name; a
refused peer is logged with its address and counted in `stats.tls_refused`. Payload checksums
are required on plaintext connections and optional on TLS ones.
A compressed DATA frame (transport/codec.py) is received into its connection's scratch buffer,
its CRC checked on those wire bytes, then decompressed straight into the tensor's slice
(`_into` and `_land`, the only two places that know about codecs); everything past that sees
the tensor's bytes and the chunk's tensor extent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from prfaas.core.errors import ConfigError, TransportError
from prfaas.transport import codec as codecs
from prfaas.transport.arena import ReceiveArena
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
    decode_end,
    decode_header,
    inflated_header,
    payload_checksum,
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
    # Tensors land in one reused arena of this size (transport/arena.py; 0: a fresh array per
    # tensor, which pays its first-touch page faults during the transfer). `pretouch_arena`
    # maps every page at start(); otherwise pages are mapped by the first transfers to use them.
    arena_bytes: int = 256 * 2**20
    pretouch_arena: bool = False

    def __post_init__(self) -> None:
        if not self.frame_timeout_s > 0:
            raise ConfigError("frame_timeout_s", self.frame_timeout_s, "must be positive")
        if self.idle_timeout_s is not None and not self.idle_timeout_s > 0:
            raise ConfigError("idle_timeout_s", self.idle_timeout_s, "must be positive or None")
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "must be 0..65535")
        if self.arena_bytes < 0:
            raise ConfigError("arena_bytes", self.arena_bytes, "must be >= 0 (0: no arena)")


@dataclass(slots=True)
class _Conn:
    chan: Channel
    peer: str
    open_ids: set[int] = field(default_factory=set)  # requests with DATA here, no END yet
    current_id: int | None = None  # request of the frame being read
    head: bytearray = field(default_factory=lambda: bytearray(HEADER_BYTES))
    head_bytes: int = 0  # of the next header, already read by the payload thread
    chained_frames: int = 0  # frames the payload thread went on to, not yet in `stats`
    chained_bytes: int = 0  # (headers included)
    scratch: bytearray = field(default_factory=bytearray)  # compressed payloads land here first


@dataclass(slots=True)
class ReceiverStats:
    received_bytes: int = 0
    received_frames: int = 0
    connections_accepted: int = 0
    connections_failed: int = 0
    tls_refused: int = 0  # handshakes failed or certificate names refused
    thread_frames: int = 0  # DATA frames a payload thread went on to without the loop
    compressed_frames: int = 0  # DATA frames that arrived compressed (decompressed on arrival)
    decompressed_bytes: int = 0  # the tensor bytes those frames carried


class KVReceiver:
    def __init__(self, config: ReceiverConfig | None = None,
                 on_tensor: TensorCallback | None = None,
                 allocate: Callable[[int], np.ndarray] | None = None, *,
                 tls: ssl.SSLContext | None = None,
                 accept_peer: Callable[[str | None], bool] | None = None) -> None:
        """`allocate(nbytes)` returns the uint8 buffer a tensor is received into (default:
        the receive arena, `config.arena_bytes`; a fresh numpy array without one). Arena memory
        is reused only once no array views it, so a consumer may keep what it was given."""
        self.config = config or ReceiverConfig()
        self.tls, self.accept_peer = tls, accept_peer
        self.on_tensor = on_tensor
        self.arena = (ReceiveArena(self.config.arena_bytes, pretouch=False)
                      if allocate is None and self.config.arena_bytes else None)
        self.allocate = allocate or (self.arena.allocate if self.arena else fresh_buffer)
        self.stats = ReceiverStats()
        self.errors: list[TransportError] = []  # every connection-closing error, in order
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._assemblies: dict[int, Assembly] = {}
        self._retired: deque[int] = deque(maxlen=_RETIRED_IDS)
        self._retired_set: set[int] = set()
        self._pool = ThreadPoolExecutor(64, "kv-recv")  # threads start on demand
        # Assemblies are touched by the loop and by payload threads (which go on to the next
        # DATA frame themselves, creating its tensor when it is the first chunk).
        self._lock = threading.RLock()

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
        if self.arena is not None and self.config.pretouch_arena:
            self.arena.pretouch()
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
        with self._lock:
            if request_id in self._retired_set:
                return None
            asm = self._assemblies.get(request_id)
            if asm is None:
                asm = self._assemblies[request_id] = Assembly(request_id, self.allocate,
                                                              lock=self._lock)
            return asm

    def _retire(self, request_id: int) -> None:
        with self._lock:
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

    async def _read_payload(self, conn: _Conn, h: FrameHeader, into: memoryview
                            ) -> FrameHeader:
        """Receive `h`'s payload; a payload thread may go on with the DATA frames queued
        behind it (each handed to `_chunk_arrived` as it completes). Returns the header of
        the last frame read, whose payload the caller accounts for."""
        crc: int | None = None
        if len(into) >= THREAD_MIN_BYTES:
            loop = asyncio.get_running_loop()
            job = loop.run_in_executor(self._pool, self._frames_sync, loop, conn, h, into)
            try:
                h, into, got, conn.head_bytes, crc = await with_timeout(
                    asyncio.shield(job), None, f"payload from {conn.peer}")
            except asyncio.CancelledError:
                conn.chan.close()  # the thread must stop writing into `into`; it sees closed
                with contextlib.suppress(Exception):
                    await job
                raise
            finally:
                self._count_chained(conn)
        else:
            got = await with_timeout(recv_exactly(conn.chan, into), self.config.frame_timeout_s,
                                     _what(h, conn))
        if got < len(into):
            raise ShortRead(f"{_what(h, conn)}: peer closed after {got} of {len(into)} bytes")
        if h.payload_checksummed:
            crc = payload_checksum(into) if crc is None else crc
            if crc != h.payload_crc:
                raise ChecksumMismatch(f"{_what(h, conn)}: payload crc32 {crc:#010x}, header "
                                       f"says {h.payload_crc:#010x}")
        self.stats.received_bytes += HEADER_BYTES + len(into)
        return self._land(h, into) if h.codec else h

    def _frames_sync(self, loop: asyncio.AbstractEventLoop, conn: _Conn, h: FrameHeader,
                     into: memoryview) -> tuple[FrameHeader, memoryview, int, int, int | None]:
        """Payload thread: receive `h`'s payload and check its CRC while it is in cache (the
        GIL is released, so connections check in parallel). Then, while a request is open on
        the connection (a frame must follow: its END at least), wait here for the next header
        (under `frame_timeout_s`, as the loop would) and, when it is a sound DATA frame of a
        live request, account this frame on the loop and receive that one too: the loop sees a
        connection's request at its first frame and its END, not once per chunk. Returns the
        last frame (header, buffer, bytes got, bytes of the next header already read, its CRC)."""
        head = memoryview(conn.head)
        with conn.chan.thread_io():
            while True:
                got = conn.chan.recv_exactly_sync(into, self.config.frame_timeout_s)
                crc = (payload_checksum(into) if h.payload_checksummed and got == len(into)
                       else None)
                if got < len(into) or (crc is not None and crc != h.payload_crc):
                    return h, into, got, 0, crc
                h = self._land(h, into) if h.codec else h  # (the caller sees a landed frame)
                head_bytes = (conn.chan.recv_exactly_sync(head, self.config.frame_timeout_s)
                              if conn.open_ids else conn.chan.try_recv_sync(head))
                nxt = self._next_data(conn, head_bytes)
                if nxt is None:
                    return h, into, got, head_bytes, crc
                self._chunk_arrived_sync(loop, conn, h, len(into))
                h, into = nxt

    def _next_data(self, conn: _Conn, head_bytes: int) -> tuple[FrameHeader, memoryview] | None:
        """The next frame and its buffer when the thread may receive it (else the loop does)."""
        if head_bytes < HEADER_BYTES:
            return None
        try:
            h = decode_header(conn.head, self.config.limits)
        except TransportError:
            return None  # the loop decodes it again and fails the connection
        if h.frame_type != FrameType.DATA or (not h.payload_checksummed
                                              and not conn.chan.authenticated):
            return None
        with self._lock:
            asm = None if h.request_id in self._retired_set else self._assembly(h.request_id)
            if asm is None or asm.finished:
                return None
            try:
                view = self._into(asm, h, conn)
            except TransportError:
                return None
            conn.open_ids.add(h.request_id)
        conn.current_id = h.request_id
        return h, view

    def _into(self, asm: Assembly, h: FrameHeader, conn: _Conn) -> memoryview:
        """Where `h`'s payload is received: its tensor's slice, or for a compressed payload
        the connection's scratch buffer (`_land` decompresses it into the slice). Every live
        DATA frame passes here once with its header as it travelled: its wire bytes count."""
        asm.count_wire(h)
        if not h.codec:
            return asm.target(h)
        if len(conn.scratch) < h.chunk_bytes:
            conn.scratch = bytearray(h.chunk_bytes)
        return memoryview(conn.scratch)[: h.chunk_bytes]

    def _land(self, h: FrameHeader, payload: memoryview) -> FrameHeader:
        """A compressed frame whose wire CRC held: decompress it into its tensor's slice
        (in the calling thread, GIL released); returns the header as the tensor sees it.
        A frame of a request no longer live is dropped undecoded."""
        logical = inflated_header(h, codecs.raw_length(payload), self.config.limits)
        with self._lock:
            asm = self._assemblies.get(h.request_id)
            if asm is None or asm.finished:
                return logical
            into = asm.target(logical)
            self.stats.compressed_frames += 1
            self.stats.decompressed_bytes += logical.chunk_bytes
        codecs.decompress_into(h.codec, payload, into)
        return logical

    def _chunk_arrived_sync(self, loop: asyncio.AbstractEventLoop, conn: _Conn,
                            h: FrameHeader, wire_bytes: int) -> None:
        """Payload thread: count a chunk it went on from (under the lock, as the loop would);
        only a completed tensor wakes the loop (for `on_tensor`), not every chunk: a loop
        wake-up per 1 MiB chunk cost a self-pipe write, an epoll round and a GIL hand-over."""
        conn.chained_frames += 1
        conn.chained_bytes += HEADER_BYTES + wire_bytes
        with self._lock:
            asm = self._assemblies.get(h.request_id)
            if asm is None or asm.finished:  # failed meanwhile: its buffers are gone
                return
            array = asm.chunk_done(h)
        if array is not None and self.on_tensor is not None:
            loop.call_soon_threadsafe(self._tensor_arrived, h, array)

    def _tensor_arrived(self, h: FrameHeader, array: np.ndarray) -> None:
        asm = self._assemblies.get(h.request_id)
        if asm is not None and not asm.finished:
            self._notify(asm, h, array)

    def _count_chained(self, conn: _Conn) -> None:
        """On the loop: the payload thread's frames into `stats`."""
        n, conn.chained_frames = conn.chained_frames, 0
        self.stats.received_frames += n
        self.stats.thread_frames += n
        self.stats.received_bytes += conn.chained_bytes
        conn.chained_bytes = 0

    def _chunk_arrived(self, h: FrameHeader) -> None:
        """On the loop: count a received chunk; hand out its tensor once complete."""
        asm = self._assemblies.get(h.request_id)
        if asm is None or asm.finished:  # failed while this chunk arrived (another connection,
            return  # a consumer callback): its buffers are gone, drop the chunk
        array = asm.chunk_done(h)
        if array is not None and self.on_tensor is not None:
            self._notify(asm, h, array)

    async def _dispatch(self, conn: _Conn, h: FrameHeader) -> None:
        asm = self._assembly(h.request_id)
        live = asm is not None and not asm.finished
        if h.frame_type == FrameType.DATA:
            if asm is None or not live:  # late frame of a failed/consumed request: drop it
                await self._read_payload(conn, h, memoryview(bytearray(h.chunk_bytes)))
                return
            conn.open_ids.add(h.request_id)
            self._chunk_arrived(await self._read_payload(conn, h, self._into(asm, h, conn)))
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


def _what(h: FrameHeader, conn: _Conn) -> str:
    return f"payload of request {h.request_id} layer {h.layer} from {conn.peer}"
