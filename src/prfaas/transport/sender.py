"""KVSender: stream tensors of a request to one KVReceiver over N TCP connections.

`send_array` cuts a tensor into chunks and queues each on the least-loaded connection; it
returns once the chunks are queued (so the caller can compute the next layer) and blocks only
when `max_inflight_bytes` are queued but not yet sent (backpressure). `finish` sends an END
frame on every connection and waits until all the request's frames are in the kernel. One
token bucket, shared by all connections, shapes the link when `rate_gbps` is set.
A failed connection breaks the sender: every pending and later call raises that error, and
the caller opens a new sender. Arrays must not be modified until `finish` returns.
With `tls` (an ssl.SSLContext holding this side's certificate) every connection is TLS,
`server_name` is the name the receiver's certificate must carry, and DATA frames carry no
payload checksum (the TLS records authenticate them).
With `compression` (lz4, zstd, or auto) each DATA chunk is compressed (transport/codec.py) by
the connection's writer thread just before it is sent, or on a shaped link by a worker thread
before it is paced (the bucket counts wire bytes), and travels compressed when that makes
it smaller; `auto` measures both codecs on the first `AUTO_SAMPLE_MIN_BYTES` or more of KV it is
given (one tensor, or the first tensors together, at most `AUTO_SAMPLE_MAX_BYTES`) and keeps the
choice of policy/compression.py for the sender's life (`codec`, `codec_speeds`); what is queued
before that travels raw.
Backpressure and pending bytes count tensor bytes; the token bucket, `stats()` and the link
monitor's sent bytes count wire bytes.
Each connection has one writer thread (transport/writer.py) that owns its socket: unshaped
frames are handed to it as they are queued, shaped ones once the bucket releases them; it
reports what it wrote to the loop per batch, where `stats()`, the monitor and the room under
`max_inflight_bytes` are updated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from prfaas.core.errors import ConfigError, TransportError
from prfaas.core.units import MIB
from prfaas.policy.compression import MODES, CodecSpeed, choose_compression
from prfaas.transport import codec as codecs
from prfaas.transport.channel import Channel, TlsChannel, TlsRefused
from prfaas.transport.errors import ConnectFailed
from prfaas.transport.monitor import LinkMonitor
from prfaas.transport.shaper import TokenBucket
from prfaas.transport.sockio import tune, with_timeout
from prfaas.transport.tcpinfo import tcp_retransmits
from prfaas.transport.wire import (
    HEADER_BYTES,
    EndInfo,
    FrameHeader,
    Kind,
    abort_frame,
    data_header_unsealed,
    dtype_code,
    end_frame,
    packed_header,
    seal_header,
)
from prfaas.transport.wire import kind_code as to_kind
from prfaas.transport.writer import ConnectionWriter

THREAD_MIN_BYTES = 64 * 1024  # shaped links compress payloads this big in a worker thread
# Chunk size when `chunk_bytes` is None: a shaped link paces frame by frame, so its frames stay
# small; an unshaped one pays per-frame work (a header, its sealing, a sendmsg, a GIL hand-over,
# and on the receiver the same) that issue 23's probes put at 0.71 -> 0.80 of a plain socket's
# goodput at 8 connections going from 1 to 4 MiB.
SHAPED_CHUNK_BYTES = MIB
UNSHAPED_CHUNK_BYTES = 4 * MIB
REPORT_BYTES = 8 * MIB  # a writer reports its sent frames to the loop per batch of at most this
AUTO_SAMPLE_MIN_BYTES = 256 * 1024  # `compression: auto` decides on a tensor at least this big
AUTO_SAMPLE_MAX_BYTES = 4 * MIB  # ... measuring the codecs on at most this much of it


@dataclass(frozen=True, slots=True)
class SenderConfig:
    num_connections: int = 4
    chunk_bytes: int | None = None  # None: SHAPED_CHUNK_BYTES or UNSHAPED_CHUNK_BYTES
    max_inflight_bytes: int = 64 * MIB
    rate_gbps: float | None = None  # None: unshaped
    burst_bytes: int | None = None  # None: TokenBucket's default
    connect_timeout_s: float = 5.0
    io_timeout_s: float = 30.0  # one frame into the kernel
    finish_timeout_s: float = 300.0  # a whole request's queued frames into the kernel
    compression: str = "none"  # none | lz4 | zstd | auto (policy/compression.py)
    # the link's rate for `auto` when this sender does not shape it (netns, a shared bucket);
    # None: rate_gbps (and None there too: an unshaped link, which auto never compresses)
    link_rate_gbps: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_connections", "chunk_bytes", "max_inflight_bytes"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "must be positive")
        for name in ("connect_timeout_s", "io_timeout_s", "finish_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "must be positive")
        if self.rate_gbps is not None and not self.rate_gbps > 0:
            raise ConfigError("rate_gbps", self.rate_gbps, "must be positive or None")
        if self.compression not in MODES:
            raise ConfigError("compression", self.compression,
                              f"must be one of {', '.join(MODES)}")
        if self.link_rate_gbps is not None and not self.link_rate_gbps > 0:
            raise ConfigError("link_rate_gbps", self.link_rate_gbps, "must be positive or None")


_POLL_HANGUP = getattr(select, "POLLRDHUP", 0x2000)  # the peer shut its side (Linux)


@dataclass(slots=True)
class _Frame:
    request_id: int
    # A DATA header is sealed (its payload CRC computed) by the thread that sends it, in
    # parallel across connections and while the payload is about to be read anyway.
    header: bytes | FrameHeader
    payload: memoryview | bytes
    codec: str | None = None  # compress the payload with this codec before it is sent
    queued_nbytes: int = 0  # what `_enqueue` counted (tensor bytes), given back by `_sent`

    @property
    def nbytes(self) -> int:
        head = HEADER_BYTES if isinstance(self.header, FrameHeader) else len(self.header)
        return head + len(self.payload)

    def parts(self) -> list[bytes | memoryview]:
        """Header (sealed now: its payload CRC, GIL released) and payload, to write in order."""
        h = self.header
        return [h if isinstance(h, bytes) else seal_header(h, self.payload), self.payload]

    def pack(self) -> None:
        """Compress the payload when the frame asks for it and it shrinks (any thread)."""
        name, self.codec = self.codec, None
        if name is None or not isinstance(self.header, FrameHeader):
            return
        packed = codecs.compress(name, self.payload)
        if packed is not None:
            self.header = packed_header(self.header, codecs.codec_id(name), len(packed))
            self.payload = packed


@dataclass(slots=True)
class _Request:
    num_tensors: int = 0
    tensor_bytes: int = 0
    unsent_frames: int = 0
    wire_payload_bytes: int = 0  # DATA payload bytes sent (compressed where they were)
    drained: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _Stream:
    chan: Channel
    writer: ConnectionWriter | None = None  # the thread that writes this connection's frames
    # frames waiting for the token bucket (shaped links only: unshaped ones go to the writer)
    paced: asyncio.Queue[_Frame] = field(default_factory=asyncio.Queue)
    failed: asyncio.Future[None] | None = None  # the writer's first failure
    queued_bytes: int = 0
    sent_bytes: int = 0
    sent_frames: int = 0
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class SenderStats:
    sent_bytes: int
    sent_frames: int
    per_connection_bytes: tuple[int, ...]
    pending_bytes: int
    retransmits: int
    codec: str | None = None  # the codec in use ("none", "lz4", "zstd"; None: auto undecided)
    compressed_frames: int = 0  # DATA frames that travelled compressed


class KVSender:
    def __init__(self, host: str, port: int, config: SenderConfig | None = None,
                 monitor: LinkMonitor | None = None, bucket: TokenBucket | None = None, *,
                 tls: ssl.SSLContext | None = None, server_name: str | None = None) -> None:
        """`bucket` shares one shaped link among several senders (e.g. one per decode node
        behind the same inter-DC link); without it, `config.rate_gbps` shapes this sender."""
        self.host, self.port = host, port
        self.tls, self.server_name = tls, server_name or host
        self.config = config or SenderConfig()
        self.monitor = monitor
        if bucket is None and self.config.rate_gbps is not None:
            bucket = TokenBucket(self.config.rate_gbps, self.config.burst_bytes)
        self._bucket = bucket
        self.chunk_bytes = self.config.chunk_bytes or (
            SHAPED_CHUNK_BYTES if bucket is not None else UNSHAPED_CHUNK_BYTES)
        self._streams: list[_Stream] = []
        self._requests: dict[int, _Request] = {}
        self._inflight_bytes = 0
        self._space: list[asyncio.Future[None]] = []  # `_enqueue`s waiting for room
        self._error: TransportError | None = None
        self._pool: ThreadPoolExecutor | None = None
        mode = self.config.compression
        self.codec: str | None = None if mode == "auto" else mode
        self.codec_speeds: tuple[CodecSpeed, ...] = ()  # what `auto` measured
        self._compressed_frames = 0
        self._auto_sample: list[bytes] = []  # small tensors' bytes until `auto` has enough
        if monitor is not None:
            monitor.add_retransmit_source(self.tcp_retransmits)

    async def __aenter__(self) -> KVSender:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        n = self.config.num_connections
        self._pool = ThreadPoolExecutor(n, "kv-pack")  # compression: `auto`'s measurement, and
        # shaped links' payloads (compressed before they are paced); threads start on demand
        # Completions are reported per batch of about this much (every batch when idle): small
        # enough that the connections' unreported bytes leave `max_inflight_bytes` room.
        report_bytes = max(1, min(REPORT_BYTES, self.config.max_inflight_bytes // (2 * n)))
        for i in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tune(sock)
            what = f"connect {self.host}:{self.port} (connection {i})"
            try:
                await with_timeout(loop.sock_connect(sock, (self.host, self.port)),
                                   self.config.connect_timeout_s, what)
                chan = await self._open_channel(sock, what)
            except TransportError as exc:
                sock.close()
                await self.close()
                raise ConnectFailed(str(exc)) from exc
            stream = _Stream(chan, failed=loop.create_future())
            stream.writer = ConnectionWriter(
                chan, f"send to {self.host}:{self.port} (connection {i})",
                self.config.io_timeout_s, report_bytes,
                functools.partial(self._sent, stream), functools.partial(_resolve, stream))
            stream.task = asyncio.create_task(self._pump(stream))
            self._streams.append(stream)

    async def _open_channel(self, sock: socket.socket, what: str) -> Channel:
        if self.tls is None:
            return Channel(sock)
        try:
            return await with_timeout(
                TlsChannel.open(sock, self.tls, server_side=False, peer=what,
                                server_hostname=self.server_name),
                self.config.connect_timeout_s, f"{what}: TLS handshake")
        except TlsRefused as exc:
            raise ConnectFailed(str(exc)) from exc

    async def send_array(self, request_id: int, layer: int, kind: str | Kind, name: str,
                         array: np.ndarray, *, bfloat16: bool = False) -> None:
        """Queue one tensor; returns when every chunk is queued (not yet sent)."""
        self._check()
        code, kind_c = dtype_code(array, bfloat16), to_kind(kind)
        if array.dtype.byteorder == ">":  # the wire is little-endian
            array = array.astype(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
            array = np.ascontiguousarray(array)
        view = array.reshape(-1).view(np.uint8).data
        if self.codec is None:
            await self._sample(view)
        codec = self.codec if self.codec in codecs.CODEC_ID else None
        req = self._requests.setdefault(request_id, _Request())
        req.num_tensors += 1
        req.tensor_bytes += len(view)
        step, shape, crc = self.chunk_bytes, tuple(array.shape), self.tls is None
        for offset in range(0, max(len(view), 1), step):
            chunk = view[offset : offset + step]
            header = data_header_unsealed(request_id, layer, kind_c, name, code, shape,
                                          len(view), offset, len(chunk), crc)
            await self._enqueue(_Frame(request_id, header, chunk, codec), self._least_loaded())
        # Let the connections' pumps start on these chunks now: without a yield, a caller that
        # queues many tensors in a row (a whole request at once) filled `max_inflight_bytes`
        # (64 frames) before the first byte left, 2-11 ms of a ~200 ms transfer in issue 23's
        # probe at 8 connections.
        await asyncio.sleep(0)

    async def _sample(self, view: memoryview) -> None:
        """`auto`: gather KV to measure the codecs on; decide once there is enough."""
        if len(view) >= AUTO_SAMPLE_MIN_BYTES:
            self._auto_sample = []
            await self._choose_codec([view[:AUTO_SAMPLE_MAX_BYTES]])
            return
        self._auto_sample.append(bytes(view))
        if sum(len(b) for b in self._auto_sample) >= AUTO_SAMPLE_MIN_BYTES:
            sample, self._auto_sample = self._auto_sample, []
            await self._choose_codec([memoryview(b) for b in sample])

    async def _choose_codec(self, sample: list[memoryview]) -> None:
        """`auto`: time the codecs on real KV (in a thread) and fix the choice."""
        loop = asyncio.get_running_loop()
        speeds = await loop.run_in_executor(self._pool, functools.partial(
            codecs.measure, sample, chunk_bytes=self.chunk_bytes))
        if self.codec is None:  # (another send_array may have decided meanwhile)
            rate = self.config.link_rate_gbps or self.config.rate_gbps
            self.codec_speeds = speeds
            self.codec = choose_compression("auto", rate, self.config.num_connections, speeds)

    async def finish(self, request_id: int, timeout_s: float | None = None,
                     manifest: bytes = b"") -> int:
        """Send END on every connection (the `manifest` travels on the first one); wait until
        all of the request's frames are sent. Returns the request's DATA payload bytes as they
        crossed the wire (its tensor bytes, less what compression saved)."""
        self._check()
        req = self._requests.setdefault(request_id, _Request())
        n = len(self._streams)
        for i, stream in enumerate(self._streams):
            info = EndInfo(req.num_tensors, req.tensor_bytes, n, i, manifest if i == 0 else b"")
            await self._enqueue(_Frame(request_id, end_frame(request_id, info), b""), stream)
        await self._await_drained(request_id, req, timeout_s)
        return req.wire_payload_bytes

    async def abort(self, request_id: int, reason: str) -> None:
        """Tell the receiver the request is abandoned (it fails the request's waiter)."""
        self._check()
        req = self._requests.setdefault(request_id, _Request())
        # On every connection, like END: each one then closes the request out in order, so a
        # later hang-up of any of them is not mistaken for a peer gone mid-transfer.
        for stream in self._streams:
            await self._enqueue(_Frame(request_id, abort_frame(request_id, reason), b""), stream)
        await self._await_drained(request_id, req, None)

    async def close(self) -> None:
        for stream in self._streams:
            if stream.writer is not None:
                stream.writer.stop()
            if stream.task is not None:
                stream.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TransportError):
                    await stream.task
            stream.chan.close()
        self._streams.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        if self.monitor is not None:  # what never left is no longer pending on this link
            self.monitor.remove_pending(self._inflight_bytes)
        self._inflight_bytes = 0
        self._wake()

    def peer_closed(self) -> bool:
        """Whether the receiver closed or reset any connection (or one already failed). The
        sender never reads, so a receiver that died between two transfers (a decode instance
        killed and restarted on the same port) is otherwise found only by a failed write in
        the middle of the next transfer, whose earlier frames the kernel accepted for a dead
        peer. A poll for hang-up: not fooled by bytes the peer left unread (TLS records)."""
        if self._error is not None or not self._streams:
            return True
        mask = _POLL_HANGUP | select.POLLHUP | select.POLLERR
        for stream in self._streams:
            if stream.chan.closed:
                return True
            poller = select.poll()
            poller.register(stream.chan.sock, mask)
            if poller.poll(0):
                return True
        return False

    def stats(self) -> SenderStats:
        per = tuple(s.sent_bytes for s in self._streams)
        return SenderStats(sum(per), sum(s.sent_frames for s in self._streams), per,
                           self._inflight_bytes, self.tcp_retransmits(), self.codec,
                           self._compressed_frames)

    def tcp_retransmits(self) -> int:
        return sum(tcp_retransmits(s.chan.sock) for s in self._streams)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._streams:
            raise ConnectFailed(f"sender to {self.host}:{self.port} is not connected")

    def _least_loaded(self) -> _Stream:
        return min(self._streams, key=lambda s: s.queued_bytes)

    async def _enqueue(self, frame: _Frame, stream: _Stream) -> None:
        n = frame.nbytes
        # A frame bigger than the whole budget still passes when nothing else is in flight.
        while not (self._error is not None or self._inflight_bytes == 0
                   or self._inflight_bytes + n <= self.config.max_inflight_bytes):
            space = asyncio.get_running_loop().create_future()
            self._space.append(space)
            try:
                await space
            finally:
                space.cancel()  # (a no-op once woken)
        self._check()
        frame.queued_nbytes = n
        self._inflight_bytes += n
        stream.queued_bytes += n
        if self.monitor is not None:
            self.monitor.add_pending(n)
        req = self._requests[frame.request_id]
        req.unsent_frames += 1
        req.drained.clear()
        if self._bucket is not None:
            stream.paced.put_nowait(frame)
        else:
            assert stream.writer is not None
            stream.writer.put(frame)

    def _wake(self) -> None:
        """Wake every `_enqueue` waiting for space (each checks again)."""
        space, self._space = self._space, []
        for fut in space:
            if not fut.done():
                fut.set_result(None)

    async def _await_drained(self, request_id: int, req: _Request, timeout_s: float | None
                             ) -> None:
        timeout = self.config.finish_timeout_s if timeout_s is None else timeout_s
        wait = asyncio.ensure_future(req.drained.wait())
        try:
            await with_timeout(asyncio.wait([wait, *self._pump_tasks()],
                                            return_when=asyncio.FIRST_COMPLETED),
                               timeout, f"request {request_id}: sending its frames")
        finally:
            wait.cancel()
        self._check()
        if not req.drained.is_set():
            raise TransportError(f"request {request_id}: a connection closed before it was sent")
        del self._requests[request_id]

    def _pump_tasks(self) -> list[asyncio.Task[None]]:
        return [s.task for s in self._streams if s.task is not None]

    async def _pump(self, stream: _Stream) -> None:
        """Until the connection's writer fails (then the sender breaks); on a shaped link, also
        pace its frames through the token bucket one at a time (compressed first: the bucket
        counts wire bytes) before the writer gets them."""
        assert stream.failed is not None and stream.writer is not None
        try:
            if self._bucket is None:
                await stream.failed
                return
            pacing = asyncio.ensure_future(self._pace(stream, self._bucket, stream.writer))
            try:
                await asyncio.wait([stream.failed, pacing], return_when=asyncio.FIRST_COMPLETED)
            finally:
                pacing.cancel()
            stream.failed.result() if stream.failed.done() else pacing.result()
        except TransportError as exc:
            self._fail(exc)

    async def _pace(self, stream: _Stream, bucket: TokenBucket, writer: ConnectionWriter
                    ) -> None:
        while True:
            frame = await stream.paced.get()
            if frame.codec:
                if len(frame.payload) < THREAD_MIN_BYTES:
                    frame.pack()
                else:
                    loop = asyncio.get_running_loop()
                    await with_timeout(loop.run_in_executor(self._pool, frame.pack), None,
                                       writer.what)
            await bucket.acquire(frame.nbytes)
            writer.put(frame)

    def _sent(self, stream: _Stream, frames: list[_Frame]) -> None:
        """On the loop: a batch of the stream's frames is in the kernel."""
        queued = wire = 0
        for frame in frames:
            queued += frame.queued_nbytes
            wire += frame.nbytes
            req = self._requests[frame.request_id]
            req.unsent_frames -= 1
            if isinstance(frame.header, FrameHeader):  # a DATA frame
                req.wire_payload_bytes += len(frame.payload)
                self._compressed_frames += frame.header.codec != 0
            if req.unsent_frames == 0:
                req.drained.set()
        stream.queued_bytes -= queued
        stream.sent_bytes += wire
        stream.sent_frames += len(frames)
        if self.monitor is not None:
            self.monitor.remove_pending(queued)
            self.monitor.record_sent(wire)
        self._inflight_bytes -= queued
        self._wake()

    def _fail(self, exc: TransportError) -> None:
        if self._error is None:
            self._error = exc
        self._wake()


def _resolve(stream: _Stream, exc: TransportError) -> None:
    """On the loop: the writer failed; the stream's pump breaks the sender."""
    if stream.failed is not None and not stream.failed.done():
        stream.failed.set_exception(exc)
