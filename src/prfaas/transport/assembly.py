"""Reassembly of one request's tensors from chunks that arrive on any connection, in any order.

An `Assembly` hands out the exact buffer slice a chunk is received into (no copy), counts bytes
per tensor, and completes once an END frame arrived from every one of the sender's streams:
TCP keeps each stream in order, so by then every DATA frame has arrived. It then checks the
totals that the END frames announced. No sockets here; the receiver drives it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prfaas.core.errors import TransportError
from prfaas.transport.errors import BadShape, ShortRead
from prfaas.transport.wire import DType, EndInfo, FrameHeader, numpy_dtype


@dataclass(frozen=True, slots=True)
class ReceivedKV:
    """A complete request: layer -> tensor name -> array (bf16 tensors arrive as uint16 words,
    listed in `bfloat16`), with the layer kinds, byte count and arrival times (monotonic s)."""

    request_id: int
    layers: dict[int, dict[str, np.ndarray]]
    kinds: dict[int, str]
    bfloat16: frozenset[tuple[int, str]]
    num_bytes: int
    first_byte_s: float
    complete_s: float
    manifest: bytes = b""  # what the sender's first END carried (serve/worker/manifest.py reads it)
    # DATA payload bytes as they crossed the link (compressed where they were): what the
    # sender's `finish` returned for this request; `num_bytes` is the tensors' bytes
    wire_bytes: int = 0


@dataclass(slots=True)
class _Tensor:
    header: FrameHeader
    buf: np.ndarray  # uint8[total_bytes]
    received_bytes: int = 0

    def array(self) -> np.ndarray:
        return self.buf.view(numpy_dtype(self.header.dtype)).reshape(self.header.shape)


def fresh_buffer(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


@dataclass(slots=True)
class Assembly:
    request_id: int
    # Where a tensor's bytes land: a decode worker can hand out memory of its own KV pool.
    allocate: Callable[[int], np.ndarray] = fresh_buffer
    tensors: dict[tuple[int, str], _Tensor] = field(default_factory=dict)
    ends: dict[int, EndInfo] = field(default_factory=dict)
    received_bytes: int = 0
    wire_bytes: int = 0  # DATA payload bytes on the wire (compressed or not), `count_wire`
    first_byte_s: float | None = None
    result: ReceivedKV | None = None
    error: TransportError | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The receiver's lock: payload threads create tensors and slice buffers too.
    lock: AbstractContextManager[Any] = field(default_factory=threading.RLock)

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    def target(self, h: FrameHeader) -> memoryview:
        """The slice chunk `h` is received into; creates the tensor on its first chunk."""
        with self.lock:
            return self._target(h)

    def _target(self, h: FrameHeader) -> memoryview:
        if self.first_byte_s is None:
            self.first_byte_s = time.monotonic()
        key = (h.layer, h.name)
        t = self.tensors.get(key)
        if t is None:
            t = self.tensors[key] = _Tensor(h, self._buffer(h.total_bytes))
        elif (t.header.shape, t.header.dtype, t.header.kind) != (h.shape, h.dtype, h.kind):
            raise BadShape(f"request {self.request_id} layer {h.layer} {h.name!r}: chunk says "
                           f"shape={h.shape} {h.dtype.name}, first chunk said "
                           f"shape={t.header.shape} {t.header.dtype.name}")
        if t.received_bytes + h.chunk_bytes > h.total_bytes:
            raise BadShape(f"request {self.request_id} layer {h.layer} {h.name!r}: more than "
                           f"total_bytes={h.total_bytes} received (duplicate chunk)")
        view: memoryview = t.buf[h.chunk_offset : h.chunk_offset + h.chunk_bytes].data
        return view

    def _buffer(self, nbytes: int) -> np.ndarray:
        buf = self.allocate(nbytes)
        if (buf.dtype != np.uint8 or buf.shape != (nbytes,) or not buf.flags.c_contiguous
                or not buf.flags.writeable):
            raise TransportError(f"allocate({nbytes}) returned {buf.dtype}{list(buf.shape)}; "
                                 f"need a writable contiguous uint8[{nbytes}]")
        return buf

    def count_wire(self, h: FrameHeader) -> None:
        """Count a DATA frame's payload as it travels (`h`: its header on the wire)."""
        with self.lock:
            self.wire_bytes += h.chunk_bytes

    def chunk_done(self, h: FrameHeader) -> np.ndarray | None:
        """Count a received chunk; returns the tensor when its last byte has arrived."""
        with self.lock:
            t = self.tensors[(h.layer, h.name)]
            t.received_bytes += h.chunk_bytes
            self.received_bytes += h.chunk_bytes
            return t.array() if t.received_bytes == h.total_bytes else None

    def end(self, info: EndInfo) -> bool:
        """Record one stream's END; True (and `result` set) once the request is complete."""
        with self.lock:
            return self._end(info)

    def _end(self, info: EndInfo) -> bool:
        first = next(iter(self.ends.values()), info)
        if (info.num_tensors, info.tensor_bytes, info.num_streams) != (
                first.num_tensors, first.tensor_bytes, first.num_streams):
            raise BadShape(f"request {self.request_id}: END frames disagree ({info} vs {first})")
        self.ends[info.stream_index] = info
        if info.manifest and info.stream_index != 0:
            raise BadShape(f"request {self.request_id}: a manifest on END of stream "
                           f"{info.stream_index} (only stream 0 carries it)")
        if len(self.ends) < info.num_streams:
            return False
        complete = [t for t in self.tensors.values() if t.received_bytes == t.header.total_bytes]
        if len(complete) != info.num_tensors or self.received_bytes != info.tensor_bytes:
            raise ShortRead(f"request {self.request_id}: sender announced {info.num_tensors} "
                            f"tensors / {info.tensor_bytes} bytes, got {len(complete)} complete "
                            f"of {len(self.tensors)} / {self.received_bytes} bytes")
        self._complete()
        return True

    def fail(self, exc: TransportError) -> None:
        with self.lock:
            if self.finished:
                return
            self.error = exc
            self.tensors.clear()  # free the buffers now; the waiter only needs the error
            self.done.set()

    def _complete(self) -> None:
        layers: dict[int, dict[str, np.ndarray]] = {}
        kinds: dict[int, str] = {}
        for (layer, name), t in sorted(self.tensors.items()):
            layers.setdefault(layer, {})[name] = t.array()
            kinds[layer] = t.header.kind.name.lower()
        bf16 = frozenset(k for k, t in self.tensors.items() if t.header.dtype == DType.BFLOAT16)
        now_s = time.monotonic()
        self.result = ReceivedKV(self.request_id, layers, kinds, bf16, self.received_bytes,
                                 self.first_byte_s or now_s, now_s, self.ends[0].manifest,
                                 self.wire_bytes)
        self.done.set()
