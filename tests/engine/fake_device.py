"""A fake asynchronous device for the layer shipper's tests (engine/device_ops.py's seam).

Each stream is a thread that runs its queued operations in order, later than they are issued;
an event completes when its stream reaches it; a stream waiting on an event stops there until
the event completes. The compute stream can be held closed (`hold=True` until `open()`): the
model then issues work that the device has not run, as on a GPU running behind the host.
Every host thread that blocks on the device is logged in `waits` (thread name, what), so a
test can say which thread waited. Faults: `fail_copy` (a copy operation raises, as a device
error would), `pin_fails` (pinned host memory cannot be allocated), `skip_waits` (a buggy copy
stream that does not wait for the layer: a negative control for the ordering).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from prfaas.engine.device_ops import CopyJob, DeviceEvent, DeviceOps, Gather


class FakeEvent(DeviceEvent):
    def __init__(self, device: FakeAsyncDevice, what: str) -> None:
        self.device, self.what = device, what
        self.flag = threading.Event()
        self.error: BaseException | None = None

    def complete(self, error: BaseException | None = None) -> None:
        self.error = error
        self.flag.set()

    def query(self) -> bool:
        return self.flag.is_set()

    def synchronize(self) -> None:
        self.device.log_wait(f"event {self.what}")
        if not self.flag.wait(timeout=30):
            raise TimeoutError(f"fake device: {self.what} never completed")
        if self.error is not None:
            raise RuntimeError(f"fake device error before {self.what}: {self.error}")


class FakeStream:
    def __init__(self, name: str, gate: threading.Event) -> None:
        self.name, self.gate = name, gate
        self.ops: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.error: BaseException | None = None  # raised by an op, until an event takes it
        self.ran = 0
        self.thread = threading.Thread(target=self._run, name=f"fake-{name}", daemon=True)
        self.thread.start()

    def put(self, op: Callable[[], None]) -> None:
        self.ops.put(op)

    def take_error(self) -> BaseException | None:
        error, self.error = self.error, None
        return error

    def _run(self) -> None:
        while (op := self.ops.get()) is not None:
            self.gate.wait()
            try:
                op()
            except BaseException as exc:  # the device's error, kept
                self.error = self.error or exc
            self.ran += 1

    def stop(self) -> None:
        self.ops.put(None)
        self.thread.join(timeout=10)


class FakeAsyncDevice(DeviceOps):
    name = "fake"
    asynchronous = True

    def __init__(self, hold: bool = False, fail_copy: int | None = None,
                 pin_fails: bool = False, skip_waits: bool = False) -> None:
        self.compute_gate = threading.Event()
        if not hold:
            self.compute_gate.set()
        free = threading.Event()
        free.set()
        self.compute = FakeStream("compute", self.compute_gate)
        self.copy = FakeStream("copy", free)
        self.host = FakeStream("host", free)
        self.fail_copy, self.pin_fails, self.skip_waits = fail_copy, pin_fails, skip_waits
        self.copies = 0
        self.waits: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    # -- what tests use -----------------------------------------------------------------
    def launch(self, fn: Callable[[], None]) -> None:
        """Queue the model's compute (e.g. a layer writing its KV) on the compute stream."""
        self.compute.put(fn)

    def open(self) -> None:
        self.compute_gate.set()

    def waits_of(self, thread_name: str) -> list[str]:
        with self._lock:
            return [what for who, what in self.waits if who == thread_name]

    def log_wait(self, what: str) -> None:
        with self._lock:
            self.waits.append((threading.current_thread().name, what))

    def drain(self) -> None:
        """Block until every stream ran what was queued so far (test thread)."""
        for stream in (self.compute, self.copy, self.host):
            done = threading.Event()
            stream.put(done.set)
            assert done.wait(timeout=30), f"fake {stream.name} stream stuck"

    def stop(self) -> None:
        self.open()
        for stream in (self.compute, self.copy, self.host):
            stream.stop()

    # -- DeviceOps -------------------------------------------------------------------------
    def _record(self, stream: FakeStream, what: str) -> FakeEvent:
        event = FakeEvent(self, what)
        stream.put(lambda: event.complete(stream.take_error()))
        return event

    def record(self) -> DeviceEvent:
        return self._record(self.compute, "compute")

    def _wait_op(self, event: DeviceEvent) -> Callable[[], None]:
        assert isinstance(event, FakeEvent)

        def op() -> None:  # the stream (not a host thread) waits
            event.flag.wait()
        return op

    def copy_async(self, after: DeviceEvent, gather: Gather, host: torch.Tensor | None,
                   keep: tuple[torch.Tensor, ...] = ()) -> CopyJob:
        self.copies += 1
        fail = self.fail_copy is not None and self.copies == self.fail_copy
        job = CopyJob(FakeEvent(self, "read"), None)
        host_done = FakeEvent(self, "host") if host is not None else None
        job.host_done = host_done
        if not self.skip_waits:
            self.copy.put(self._wait_op(after))

        def gather_op() -> None:
            job.staged = gather().contiguous()
            job.read_done.complete()  # type: ignore[attr-defined]

        def copy_op() -> None:
            if fail:
                raise RuntimeError("fake DMA fault")
            assert host is not None
            host.copy_(job.staged.reshape(-1).view(torch.uint8))
            job.staged = None

        self.copy.put(gather_op)
        if host is not None and host_done is not None:
            self.copy.put(copy_op)
            self.copy.put(lambda: host_done.complete(self.copy.take_error()))
        return job

    def compute_waits(self, event: DeviceEvent) -> None:
        self.compute.put(self._wait_op(event))

    def to_host(self, job: CopyJob) -> torch.Tensor:
        out: dict[str, Any] = {}
        done = FakeEvent(self, "to_host")
        self.host.put(self._wait_op(job.read_done))

        def op() -> None:
            out["t"] = job.staged.clone()
        self.host.put(op)
        self.host.put(lambda: done.complete(self.host.take_error()))
        done.synchronize()
        return out["t"]  # type: ignore[no-any-return]

    def blocking_copy(self, gather: Gather) -> torch.Tensor:
        out: dict[str, Any] = {}
        done = FakeEvent(self, "blocking copy")

        def op() -> None:
            out["t"] = gather().clone()
        self.compute.put(op)
        self.compute.put(lambda: done.complete(self.compute.take_error()))
        done.synchronize()
        return out["t"]  # type: ignore[no-any-return]

    def host_buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        if pinned and self.pin_fails:
            raise RuntimeError("cudaHostAlloc: out of memory (fake)")
        return torch.zeros(nbytes, dtype=torch.uint8)
