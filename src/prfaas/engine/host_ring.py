"""A ring of host memory sized in bytes, handed out in order and given back in any order.

The layer shipper copies each layer's KV from the device into a slot of this ring (pinned:
the copy engine writes it while the model computes) and the sender's thread copies it out and
gives the slot back. `reserve` never waits: a ring without room says so (None) and the caller
falls back. Slots are carved in order from one buffer; a slot given back early stays taken
until every older one is given back too (FIFO reclaim: the sender drains in order, so the
ring's free space is one contiguous run, at most split once where it wraps).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch

ALIGN_BYTES = 256  # every slot starts here: a whole cache line and any dtype's alignment


@dataclass(slots=True)
class Slot:
    offset: int
    nbytes: int  # what was asked
    span: int  # what it takes of the ring (aligned; with a wrap's skipped tail)
    released: bool = False


class HostRing:
    def __init__(self, buffer: torch.Tensor) -> None:
        """`buffer`: uint8 host memory (pinned or not); its size is the ring's capacity."""
        self.buffer = buffer.reshape(-1)
        self.capacity = int(self.buffer.numel())
        self._head = 0  # next free byte
        self._used = 0  # bytes taken by live slots (wrap padding included)
        self._slots: deque[Slot] = deque()
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used

    def reserve(self, nbytes: int) -> Slot | None:
        """A slot of `nbytes`, or None at once when the ring has no room for it now."""
        size = -(-max(nbytes, 1) // ALIGN_BYTES) * ALIGN_BYTES
        with self._lock:
            if size > self.capacity:
                return None
            if not self._used:
                self._head = 0
            pad = 0
            if self._head + size > self.capacity:  # no room before the end: wrap to 0
                pad = self.capacity - self._head
            if self._used + pad + size > self.capacity:  # the free run from head is too short
                return None
            offset = 0 if pad else self._head
            slot = Slot(offset, nbytes, pad + size)
            self._slots.append(slot)
            self._used += slot.span
            self._head = (offset + size) % self.capacity
            return slot

    def view(self, slot: Slot) -> torch.Tensor:
        """The slot's bytes (uint8, exactly `nbytes`)."""
        return self.buffer[slot.offset : slot.offset + slot.nbytes]

    def release(self, slot: Slot) -> None:
        with self._lock:
            slot.released = True
            while self._slots and self._slots[0].released:
                self._used -= self._slots.popleft().span
            if not self._slots:
                self._used = 0
