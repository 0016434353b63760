"""One connection's writer thread: the only thing that writes to a KVSender connection's socket.

Frames are handed over (`put`, any thread) to a deque under a condition; the thread takes what
is queued (up to `report_bytes`), compresses each payload that asks for it, seals its header
(payload CRC) just before that frame's blocking `sendmsg`, and reports the frames it wrote to
the loop in bulk: `on_sent(frames)` runs on the loop, at most one call pending at a time (the
next one takes everything written meanwhile), and always once the queue has run dry, so a
caller waiting for space or for its END is never left waiting on frames already sent.
The first failure (OSError, timeout, a closed channel) stops the thread and runs `on_failed`
on the loop; what was still queued is never written. Issue 23: an executor job per batch made
each connection wait for a loop round trip (and the loop for the GIL) between batches, and a
per-frame `_sent` on the loop took the sender's lock and woke its waiters once per 1 MiB frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from prfaas.core.errors import TransportError
from prfaas.transport.channel import Channel
from prfaas.transport.sockio import translate


class Frame(Protocol):
    @property
    def nbytes(self) -> int: ...

    def pack(self) -> None: ...

    def parts(self) -> list[bytes | memoryview]: ...


class ConnectionWriter:
    def __init__(self, chan: Channel, what: str, io_timeout_s: float, report_bytes: int,
                 on_sent: Callable[[list[Frame]], None],
                 on_failed: Callable[[TransportError], None]) -> None:
        self.chan, self.what = chan, what
        self._io_timeout_s, self._report_bytes = io_timeout_s, report_bytes
        self._on_sent, self._on_failed = on_sent, on_failed
        self._loop = asyncio.get_running_loop()
        self._cond = threading.Condition()
        self._queue: deque[Frame] = deque()
        self._stopped = False
        self._done: list[Frame] = []  # written, not yet reported (under _cond)
        self._posted = False  # an `_report` call is pending on the loop (under _cond)
        self._thread = threading.Thread(target=self._run, name=f"kv-send {what}", daemon=True)
        self._thread.start()

    def put(self, frame: Frame) -> None:
        with self._cond:
            self._queue.append(frame)
            self._cond.notify()

    def stop(self) -> None:
        """Stop after the frame in hand (queued frames are dropped); reports nothing more."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify()

    def _run(self) -> None:
        try:
            with self.chan.thread_io():
                while (batch := self._take()) is not None:
                    for frame in batch:
                        frame.pack()
                        self.chan.send_parts_sync(frame.parts(), self._io_timeout_s)
                    self._wrote(batch)
        except (TransportError, OSError) as exc:
            with self._cond:
                if self._stopped:
                    return
                self._stopped = True
            self._call_loop(self._on_failed, translate(exc, self.what))

    def _take(self) -> list[Frame] | None:
        """What is queued, up to `report_bytes` (at least one frame); None once stopped."""
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            batch = [self._queue.popleft()]
            nbytes = batch[0].nbytes
            while self._queue and nbytes < self._report_bytes:
                batch.append(self._queue.popleft())
                nbytes += batch[-1].nbytes
            return batch

    def _wrote(self, batch: list[Frame]) -> None:
        with self._cond:
            self._done.extend(batch)
            if self._posted or self._stopped:
                return
            self._posted = True
        self._call_loop(self._report)

    def _report(self) -> None:
        """On the loop: hand every frame written so far to `on_sent`, in one call."""
        with self._cond:
            done, self._done, self._posted = self._done, [], False
            if self._stopped:
                return
        self._on_sent(done)

    def _call_loop(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(fn, *args)
