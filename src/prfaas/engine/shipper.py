"""LayerShipper: a layer's KV from device memory to the sender, the model thread never waiting.

The model thread calls `ship` right after a layer wrote its KV (and once per request for its
final linear-attention state). On an asynchronous device (CUDA) that only issues work:
an event on the compute stream; on a copy stream that waits on it, the gather of the
request's blocks into a staging tensor, a `read` event, a non-blocking copy into a slot of a
pinned host ring sized in bytes, a `done` event. It returns a `Ticket`; the sender's thread
calls `Ticket.wait()`, which waits on the done event, copies the bytes out of the ring (the
transport keeps arrays until a transfer's END, a ring slot cannot wait that long) and gives
the slot back. `end_step()` (once per forward, vLLM's `wait_for_save`) makes the compute
stream wait, on the device, for the step's reads: the cache blocks may be reused after them;
the host goes on, it never waits for the network nor for a copy to land.

Back-pressure never stalls: when the ring has no room the request falls back to sending after
the forward (`ring_full_requests`): its layers (that one and the later ones) stay staged on the
device and the sender copies them to the host itself once `end_step()` says the forward ended.
A pinned ring that cannot be allocated falls back to pageable memory with a warning and
`pinned_fallbacks`; a copy into pageable memory holds the thread that issues it, so then every
layer is staged on the device and copied by the sender's thread. A copy that fails fails its
ticket (`ShipError`, `failed_tickets`): the caller fails the request, never sends part of it.
On the CPU the same object gathers at once on the calling thread (nothing to overlap).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from dataclasses import asdict, dataclass

import torch

from prfaas.core.errors import TransportError
from prfaas.core.units import MIB
from prfaas.engine.device_ops import CopyJob, DeviceEvent, DeviceOps, Gather, host_view
from prfaas.engine.host_ring import HostRing, Slot

log = logging.getLogger(__name__)

DEFAULT_RING_BYTES = 256 * MIB


class ShipError(TransportError):
    """A layer's KV did not reach the host (a failed device copy): its request must fail."""


@dataclass(slots=True)
class ShipperMetrics:
    tickets: int = 0  # tensors shipped
    bytes: int = 0
    staged_bytes: int = 0  # of which through the pinned ring, copied while the model ran
    ring_full_requests: int = 0  # requests that fell back to sending after the forward
    deferred_tickets: int = 0  # tensors sent after the forward (ring full, or pageable)
    pinned_fallbacks: int = 0  # 1: the pinned ring could not be allocated, pageable instead
    failed_tickets: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Ticket:
    """One tensor on its way to the host. `wait()` belongs to the sender's thread."""

    def __init__(self, request: Hashable, like: torch.Tensor | None, nbytes: int,
                 job: CopyJob | None = None, slot: Slot | None = None,
                 owner: LayerShipper | None = None,
                 release: threading.Event | None = None, ready: torch.Tensor | None = None,
                 error: str | None = None) -> None:
        self.request, self.nbytes = request, nbytes
        self._like = like  # dtype and shape of the result (an empty tensor)
        self._job, self._slot, self._owner = job, slot, owner
        self._release = release  # deferred: the forward's end
        self._ready = ready
        self._error = error
        self._lock = threading.Lock()

    @property
    def deferred(self) -> bool:
        return self._release is not None

    def done(self) -> bool:
        """Whether `wait()` would return without waiting on the device."""
        if self._ready is not None or self._error is not None:
            return True
        return (self._release is None and self._job is not None
                and self._job.host_done is not None and self._job.host_done.query())

    def wait(self) -> torch.Tensor:
        """The tensor's bytes as a host tensor of its own (not the ring's); ShipError when
        the copy failed. Idempotent."""
        with self._lock:
            if self._ready is None and self._error is None:
                self._resolve()
            if self._error is not None:
                raise ShipError(f"request {self.request}: {self._error}")
            assert self._ready is not None
            return self._ready

    def discard(self) -> None:
        """Give the ticket's ring slot back unread (its request failed or was cancelled): waits
        for the copy into the slot to land first, so no later slot gets its bytes. Sender's
        thread; idempotent; never raises."""
        with self._lock:
            if self._ready is not None or self._error is not None:
                return
            self._error = "discarded"
            job, owner, slot = self._job, self._owner, self._slot
            self._slot = None
            if job is None or owner is None:
                return
            job.staged = None
            if slot is not None and owner.ring is not None:
                try:
                    if job.host_done is not None:
                        job.host_done.synchronize()
                except Exception:  # the copy failed: nothing lands in the slot any more
                    pass
                owner.ring.release(slot)

    def _resolve(self) -> None:
        job, owner = self._job, self._owner
        assert job is not None and owner is not None and self._like is not None
        try:
            if self._release is not None:
                self._release.wait()  # sent after the forward
            if job.host_done is None:  # staged on the device: copy it now, on this thread
                self._ready = owner.ops.to_host(job).reshape(self._like.shape)
                job.staged = None
            else:
                job.host_done.synchronize()
                assert self._slot is not None and owner.ring is not None
                self._ready = host_view(owner.ring.view(self._slot), self._like).clone()
        except Exception as exc:  # any device failure fails the request
            self._error = f"device copy failed: {type(exc).__name__}: {exc}"
            owner.count_failure()
        finally:
            if self._slot is not None and owner.ring is not None:
                owner.ring.release(self._slot)
                self._slot = None


class LayerShipper:
    def __init__(self, ops: DeviceOps, ring_bytes: int = DEFAULT_RING_BYTES,
                 pinned: bool = True) -> None:
        self.ops = ops
        self.metrics = ShipperMetrics()
        self.ring: HostRing | None = None
        self.pageable = False  # the ring is not pinned: the sender's thread copies
        self._mlock = threading.Lock()
        self._fallback: set[Hashable] = set()  # requests sending after the forward
        self._release = threading.Event()  # this forward's deferred tickets
        self._reads: list[DeviceEvent] = []  # this step's reads (the compute stream waits)
        if ops.asynchronous:
            self.ring = HostRing(self._allocate(ring_bytes, pinned))

    def _allocate(self, nbytes: int, pinned: bool) -> torch.Tensor:
        if pinned:
            try:
                return self.ops.host_buffer(nbytes, pinned=True)
            except Exception as exc:  # pinning is an OS/driver limit
                log.warning("layer shipper: %d bytes of pinned host memory could not be "
                            "allocated (%s: %s); pageable instead: every layer is copied by "
                            "the sender's thread after it is staged on the device",
                            nbytes, type(exc).__name__, exc)
        self.metrics.pinned_fallbacks = 1 if pinned else 0
        self.pageable = True
        return self.ops.host_buffer(nbytes, pinned=False)

    def ship(self, request: Hashable, gather: Gather, shape: tuple[int, ...] | torch.Size,
             dtype: torch.dtype, keep: tuple[torch.Tensor, ...] = ()) -> Ticket:
        """Start moving `gather()` (a tensor of `shape` and `dtype`) to the host. `keep`:
        the tensors the gather reads (kept alive for the copy stream). Model thread; never
        waits on the device."""
        like = torch.empty(tuple(shape), dtype=dtype, device="meta")
        nbytes = like.numel() * like.element_size()
        with self._mlock:
            self.metrics.tickets += 1
            self.metrics.bytes += nbytes
        if not self.ops.asynchronous:  # the cache is host memory: gather now
            try:
                ready = gather().reshape(like.shape)
            except Exception as exc:
                self.count_failure()
                return Ticket(request, like, nbytes,
                              error=f"gather failed: {type(exc).__name__}: {exc}")
            return Ticket(request, like, nbytes, ready=ready)
        slot = None
        if not self.pageable and request not in self._fallback:
            assert self.ring is not None
            slot = self.ring.reserve(nbytes)
            if slot is None:
                self._fallback.add(request)
                with self._mlock:
                    self.metrics.ring_full_requests += 1
        try:
            after = self.ops.record()
            host = self.ring.view(slot) if slot is not None and self.ring is not None else None
            job = self.ops.copy_async(after, gather, host, keep)
        except Exception as exc:  # a launch error fails the request only
            if slot is not None and self.ring is not None:
                self.ring.release(slot)
            self.count_failure()
            return Ticket(request, like, nbytes,
                          error=f"device copy failed to start: {type(exc).__name__}: {exc}")
        self._reads.append(job.read_done)
        if slot is not None:
            with self._mlock:
                self.metrics.staged_bytes += nbytes
            return Ticket(request, like, nbytes, job, slot, self)
        with self._mlock:
            self.metrics.deferred_tickets += 1
        release = None if self.pageable else self._release
        return Ticket(request, like, nbytes, job, None, self, release)

    def end_step(self) -> None:
        """The forward ended (model thread): the compute stream waits, on the device, for
        this step's gathers to have read their blocks (they may be reused after), and the
        tickets deferred during it may go. Never waits on the host."""
        reads, self._reads = self._reads, []
        for event in reads:
            self.ops.compute_waits(event)
        self._release.set()
        self._release = threading.Event()

    def end_request(self, request: Hashable) -> None:
        """The request's last tensor was shipped: forget its fallback state."""
        self._fallback.discard(request)

    def count_failure(self) -> None:
        with self._mlock:
            self.metrics.failed_tickets += 1


class BlockingShipper:
    """The naive path, kept as the negative control of the tests and the benchmark: each
    tensor gathered and copied to the host synchronously on the model thread (`.cpu()` per
    layer), so the model waits for every layer's compute and copy. Same calls as LayerShipper."""

    def __init__(self, ops: DeviceOps) -> None:
        self.ops = ops
        self.metrics = ShipperMetrics()

    def ship(self, request: Hashable, gather: Gather, shape: tuple[int, ...] | torch.Size,
             dtype: torch.dtype, keep: tuple[torch.Tensor, ...] = ()) -> Ticket:
        like = torch.empty(tuple(shape), dtype=dtype, device="meta")
        nbytes = like.numel() * like.element_size()
        self.metrics.tickets += 1
        self.metrics.bytes += nbytes
        return Ticket(request, like, nbytes, ready=self.ops.blocking_copy(gather).reshape(shape))

    def end_step(self) -> None:
        return None

    def end_request(self, request: Hashable) -> None:
        return None
