"""The device operations the layer shipper needs, behind one small seam.

`LayerShipper` (shipper.py) never calls torch.cuda itself; it asks a `DeviceOps` to
- `record` an event on the compute stream (after the work issued so far: the layer's KV),
- `copy_async`: on a copy stream that waits on such an event, run a gather (the request's
  blocks into a staging tensor), record that the sources were read, and copy the staging
  tensor non-blocking into a host buffer, recording when the bytes are there,
- `compute_waits`: make the compute stream wait on an event, on the device (no host wait),
- `to_host`: copy a staged tensor to the host synchronously: only the sender's thread does,
- `host_buffer`: allocate host memory, pinned or not.
`CudaOps` does this with torch.cuda streams and events; `CpuOps` does it at once on the
calling thread (the cache already is host memory; nothing to overlap). The tests' fake device
(tests/engine/fake_device.py) runs the same calls on threads that complete later, so the
shipper's ordering and the model thread's freedom are checked without a GPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prfaas.core.errors import ConfigError

Gather = Callable[[], torch.Tensor]


class DeviceEvent(ABC):
    """A point in a stream's work: `query` says whether it was reached, `synchronize` blocks
    the calling thread until it is (and raises what the device work before it raised)."""

    @abstractmethod
    def query(self) -> bool: ...

    @abstractmethod
    def synchronize(self) -> None: ...


class Done(DeviceEvent):
    """An event that was reached when it was made (CPU work runs at once)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


@dataclass(slots=True)
class CopyJob:
    """What `copy_async` issued: `read_done` (the gather read its sources: they may be
    overwritten after it), `host_done` (the bytes are in the host buffer; None when no host
    copy was issued) and, without a host copy, the staged device tensor for `to_host`."""

    read_done: DeviceEvent
    host_done: DeviceEvent | None
    staged: Any = None  # the gather's result while a later `to_host` needs it


class DeviceOps(ABC):
    name: str = "?"
    asynchronous: bool = False  # False: copies run at once on the calling thread

    @abstractmethod
    def record(self) -> DeviceEvent:
        """An event after the work issued so far on the compute stream."""

    @abstractmethod
    def copy_async(self, after: DeviceEvent, gather: Gather, host: torch.Tensor | None,
                   keep: tuple[torch.Tensor, ...] = ()) -> CopyJob:
        """On the copy stream, after `after`: `gather()`, then (with `host`) a non-blocking copy
        of its result into `host` (same number of bytes). `keep`: the gather's sources, which
        must outlive the copy stream's use of them."""

    @abstractmethod
    def compute_waits(self, event: DeviceEvent) -> None:
        """The compute stream waits for `event` on the device; the host goes on."""

    @abstractmethod
    def to_host(self, job: CopyJob) -> torch.Tensor:
        """The staged tensor of `job` in host memory, copied now (blocks the calling thread:
        the sender's, never the model's)."""

    @abstractmethod
    def blocking_copy(self, gather: Gather) -> torch.Tensor:
        """The naive path (the negative control): `gather()` on the compute stream and a
        synchronous copy to the host, on the calling thread, which waits for the compute
        before it (a connector calling `.cpu()` in `save_kv_layer`)."""

    def host_buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """`nbytes` of host memory (uint8); pinned where asked (may raise)."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def index(self, ids: list[int], device: torch.device) -> torch.Tensor:
        """Block ids as an index tensor on `device`, without a host wait (call it inside a
        gather: on the copy stream)."""
        return torch.tensor(ids, dtype=torch.long, device=device)


def host_view(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`buffer` (uint8, exactly `like`'s bytes) as a tensor of `like`'s dtype and shape."""
    return buffer.view(like.dtype).view(like.shape) if like.dim() else buffer.view(like.dtype)[0]


class CpuOps(DeviceOps):
    """The cache is host memory: every copy runs now, on the calling thread."""

    name = "cpu"
    asynchronous = False

    def record(self) -> DeviceEvent:
        return Done()

    def copy_async(self, after: DeviceEvent, gather: Gather, host: torch.Tensor | None,
                   keep: tuple[torch.Tensor, ...] = ()) -> CopyJob:
        staged = gather()
        if host is None:
            return CopyJob(Done(), None, staged)
        host.view(torch.uint8).reshape(-1).copy_(_bytes_of(staged))
        return CopyJob(Done(), Done())

    def compute_waits(self, event: DeviceEvent) -> None:
        return None

    def to_host(self, job: CopyJob) -> torch.Tensor:
        out: torch.Tensor = job.staged
        return out

    def blocking_copy(self, gather: Gather) -> torch.Tensor:
        return gather()

    def host_buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class _CudaEvent(DeviceEvent):
    def __init__(self, event: Any) -> None:
        self.event = event

    def query(self) -> bool:
        return bool(self.event.query())

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaOps(DeviceOps):
    """torch.cuda: one copy stream for the model thread's gathers and copies into pinned
    memory, one more for the sender thread's synchronous copies (so they never queue behind
    the model thread's waits on later layers)."""

    name = "cuda"
    asynchronous = True

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError("device", str(device), "no CUDA device here")
        self.copy_stream = torch.cuda.Stream(self.device)
        self.host_stream = torch.cuda.Stream(self.device)

    def _event(self, stream: Any, blocking: bool = False) -> _CudaEvent:
        event = torch.cuda.Event(blocking=blocking)  # blocking: a waiting host thread sleeps
        event.record(stream)
        return _CudaEvent(event)

    def record(self) -> DeviceEvent:
        return self._event(torch.cuda.current_stream(self.device))

    def copy_async(self, after: DeviceEvent, gather: Gather, host: torch.Tensor | None,
                   keep: tuple[torch.Tensor, ...] = ()) -> CopyJob:
        assert isinstance(after, _CudaEvent)
        stream = self.copy_stream
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(after.event)
            for t in keep:  # allocated on the compute stream, read on this one
                if t.is_cuda:
                    t.record_stream(stream)
            staged = gather()
            read = self._event(stream)
            if host is None:
                return CopyJob(read, None, staged)
            host.view(torch.uint8).reshape(-1).copy_(_bytes_of(staged), non_blocking=True)
            return CopyJob(read, self._event(stream, blocking=True))

    def compute_waits(self, event: DeviceEvent) -> None:
        assert isinstance(event, _CudaEvent)
        torch.cuda.current_stream(self.device).wait_event(event.event)

    def to_host(self, job: CopyJob) -> torch.Tensor:
        assert isinstance(job.read_done, _CudaEvent)
        staged: torch.Tensor = job.staged
        with torch.cuda.device(self.device), torch.cuda.stream(self.host_stream):
            self.host_stream.wait_event(job.read_done.event)
            staged.record_stream(self.host_stream)
            return staged.to("cpu")

    def blocking_copy(self, gather: Gather) -> torch.Tensor:
        return gather().to("cpu")

    def index(self, ids: list[int], device: torch.device) -> torch.Tensor:
        # a pinned source copied non-blocking: a pageable one would make the copy wait for the
        # stream (the compute behind it); pin_memory() reuses torch's cached pinned blocks
        return torch.tensor(ids, dtype=torch.long).pin_memory().to(device, non_blocking=True)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 tensor (a view; 0-d tensors too)."""
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def device_ops(device: torch.device | str | None) -> DeviceOps:
    """The ops for a model on `device` (None or "cpu": CpuOps)."""
    dev = torch.device(device or "cpu")
    if dev.type == "cpu":
        return CpuOps()
    if dev.type == "cuda":
        return CudaOps(dev)
    raise ConfigError("device", str(device), "the layer shipper knows cpu and cuda")
