"""`LoadIndex`: the k least-loaded members of a pool whose loads change, in O(k log n).

A lazy min-heap of (key, member): `set` pushes the member's new key and remembers it as
current; `smallest(k)` pops until it has k members whose popped key is still current (stale
entries are dropped for good), then pushes those k back; `walk()` does the same lazily, for as
many as its reader takes. Keys are totally ordered tuples that end with the member's id, so
ties break as a sorted scan would. The heap is rebuilt from the current keys when stale entries
outnumber live ones 4 to 1, bounding memory.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from typing import Any

Key = tuple[Any, ...]


class LoadIndex:
    def __init__(self) -> None:
        self._key: dict[str, Key] = {}
        self._heap: list[tuple[Key, str]] = []

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, member: object) -> bool:
        return member in self._key

    def set(self, member: str, key: Key) -> None:
        if self._key.get(member) == key:
            return
        self._key[member] = key
        heapq.heappush(self._heap, (key, member))
        if len(self._heap) > 4 * len(self._key) + 64:
            self._heap = [(k, m) for m, k in self._key.items()]
            heapq.heapify(self._heap)

    def remove(self, member: str) -> None:
        self._key.pop(member, None)

    def smallest(self, k: int) -> list[str]:
        """Up to k members with the smallest current keys, smallest first."""
        heap, current = self._heap, self._key
        out: list[tuple[Key, str]] = []
        seen: set[str] = set()
        while heap and len(out) < k:
            key, member = heapq.heappop(heap)
            if current.get(member) != key or member in seen:
                continue  # stale (the member's key moved on) or a duplicate entry
            seen.add(member)
            out.append((key, member))
        for entry in out:
            heapq.heappush(heap, entry)
        return [m for _, m in out]

    def walk(self) -> Generator[tuple[Key, str], None, None]:
        """Members with their current keys, smallest first, read lazily: the top is read in
        place and popped only when the reader asks for the next; what was popped is pushed
        back when the generator is closed (close it, or let it run out)."""
        heap, current = self._heap, self._key
        taken: list[tuple[Key, str]] = []
        seen: set[str] = set()
        try:
            while heap:
                key, member = heap[0]
                if current.get(member) != key or member in seen:
                    heapq.heappop(heap)  # stale (the member's key moved on) or a duplicate
                    continue
                yield key, member
                seen.add(member)
                taken.append(heapq.heappop(heap))
        finally:
            for entry in taken:
                heapq.heappush(heap, entry)
