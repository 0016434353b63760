"""A receive arena: one pre-touched buffer that a receiver's tensors are carved from, reused
across transfers, so a transfer pays no allocation and no first-touch page faults.

A slice goes back to the arena when the last array that views it is gone (numpy views, torch
tensors made with `torch.from_numpy`, memoryviews a receiving thread still writes into): the
consumer never frees anything by hand, and memory a consumer (or an engine's cache) still holds
can never be handed to another transfer. Each slice is an instance of a private ndarray
subclass; numpy stops collapsing a view's `base` chain at a change of type, so every view made
from the plain array `allocate` returns keeps that instance alive, and its finalizer frees the
extent. Finalizers only queue the extent (they may run on any thread, even inside `allocate`);
the next `allocate` merges the queue into the free list. First fit, 64-byte aligned; when no
extent fits, `allocate` returns a fresh array (counted in `fallbacks`).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np

from prfaas.core.errors import ConfigError

_ALIGN = 64


class _Slice(np.ndarray):
    """Owner of one extent: alive as long as any view of it is."""


@dataclass(slots=True)
class ArenaStats:
    capacity_bytes: int
    used_bytes: int
    allocations: int
    fallbacks: int  # requests served by a fresh array (no extent fitted)


class ReceiveArena:
    def __init__(self, capacity_bytes: int, *, pretouch: bool = True) -> None:
        if capacity_bytes <= 0:
            raise ConfigError("arena_bytes", capacity_bytes, "must be positive")
        self.capacity_bytes = capacity_bytes - capacity_bytes % _ALIGN
        self._buf = np.empty(self.capacity_bytes, dtype=np.uint8)
        self._starts: list[int] = [0]  # free extents, sorted by start
        self._sizes: list[int] = [self.capacity_bytes]
        self._freed: deque[tuple[int, int]] = deque()  # from finalizers, merged on allocate
        self._lock = threading.Lock()
        self.allocations = self.fallbacks = 0
        self._used_bytes = 0
        if pretouch:
            self.pretouch()

    def pretouch(self) -> None:
        """Map every page now, not during a transfer (writes only what no slice holds; call
        it before receiving)."""
        for start, size in self.free_extents():
            self._buf[start : start + size].fill(0)

    def allocate(self, nbytes: int) -> np.ndarray:
        """A writable contiguous uint8[nbytes]: an extent of the arena, or a fresh array."""
        size = -(-nbytes // _ALIGN) * _ALIGN
        with self._lock:
            self._merge_freed()
            start = self._take(size) if size else None
            if start is None:
                self.fallbacks += 1
                return np.empty(nbytes, dtype=np.uint8)
            self.allocations += 1
            self._used_bytes += size
        owner = self._buf[start : start + size].view(_Slice)
        weakref.finalize(owner, self._freed.append, (start, size))
        return owner[:nbytes].view(np.ndarray)

    def stats(self) -> ArenaStats:
        with self._lock:
            self._merge_freed()
            return ArenaStats(self.capacity_bytes, self._used_bytes, self.allocations,
                              self.fallbacks)

    def free_extents(self) -> list[tuple[int, int]]:
        """(start, size) of every free extent, for tests."""
        with self._lock:
            self._merge_freed()
            return list(zip(self._starts, self._sizes, strict=True))

    def _take(self, size: int) -> int | None:
        for i, free in enumerate(self._sizes):
            if free >= size:
                start = self._starts[i]
                if free == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i], self._sizes[i] = start + size, free - size
                return start
        return None

    def _merge_freed(self) -> None:
        while self._freed:
            start, size = self._freed.popleft()
            self._used_bytes -= size
            i = bisect.bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._sizes.insert(i, size)
            if i + 1 < len(self._starts) and start + size == self._starts[i + 1]:
                self._sizes[i] += self._sizes.pop(i + 1)
                self._starts.pop(i + 1)
            if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start:
                self._sizes[i - 1] += self._sizes.pop(i)
                self._starts.pop(i)
