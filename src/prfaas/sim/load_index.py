"""`LoadIndex`: the k least-loaded members of a pool whose loads change, in O(k log n).

A lazy min-heap of (key, member): `set` pushes the member's new key and remembers it as
current; `smallest(k)` pops until it has k members whose popped key is still current (stale
entries are dropped for good), then pushes those k back; `walk()` does the same lazily, for as
many as its reader takes. Keys are totally ordered tuples that end with the member's id, so
ties break as a sorted scan would. The heap is rebuilt from the current keys when stale entries
outnumber live ones 4 to 1, bounding memory.

`SortedIndex` keeps the same order in a sorted list of (key, member): a change is two
bisections and a list insert/delete (a memmove of the list's pointers: ~1 us at 10,000 members),
the smallest is read in place and a walk reads the list with no pops, pushes or stale entries.

`BucketIndex` is the same order for keys (k, member) with k a small non-negative int (a
decoder's occupancy): a sorted list of names per k, so a move costs two bisections and the
smallest is read in place, with no stale entries to pop.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Generator, Iterator
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
        current = self._key
        if current.get(member) == key:
            return
        current[member] = key
        heap = self._heap
        heapq.heappush(heap, (key, member))
        if len(heap) > 4 * len(current) + 64:
            self._heap = [(k, m) for m, k in current.items()]
            heapq.heapify(self._heap)

    def first(self) -> str | None:
        """The member with the smallest current key (what `walk()` yields first), or None;
        stale entries on top are dropped, nothing else moves."""
        heap, current = self._heap, self._key
        while heap:
            key, member = heap[0]
            if current.get(member) == key:
                return member
            heapq.heappop(heap)
        return None

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


class BucketIndex:
    """Members ordered by (k, member), k a small non-negative int; see the module docstring.
    A walk must not overlap a change (readers only read)."""

    def __init__(self) -> None:
        self._key: dict[str, int] = {}
        self._buckets: list[list[str]] = []  # sorted names per k
        self._lo = 0  # no member has a smaller k

    def __len__(self) -> int:
        return len(self._key)

    def set(self, member: str, k: int) -> None:
        old = self._key.get(member)
        if old == k:
            return
        if k < 0:
            raise ValueError(f"BucketIndex key {k} of {member!r} is negative")
        buckets = self._buckets
        if old is not None:
            bucket = buckets[old]
            del bucket[bisect_left(bucket, member)]
        while len(buckets) <= k:
            buckets.append([])
        insort(buckets[k], member)
        self._key[member] = k
        if k < self._lo:
            self._lo = k

    def remove(self, member: str) -> None:
        old = self._key.pop(member, None)
        if old is not None:
            bucket = self._buckets[old]
            del bucket[bisect_left(bucket, member)]

    def first(self) -> str | None:
        buckets, lo = self._buckets, self._lo
        while lo < len(buckets) and not buckets[lo]:
            lo += 1
        self._lo = lo
        return buckets[lo][0] if lo < len(buckets) else None

    def walk(self) -> Iterator[str]:
        for bucket in self._buckets[self._lo:]:
            yield from bucket


class SortedIndex:
    """`LoadIndex`'s order in a sorted list of the keys themselves (they end with the member's
    id, so each is unique and compares flat); see the module docstring. A walk must not
    overlap a change (readers only read)."""

    def __init__(self) -> None:
        self._key: dict[str, Key] = {}
        self._sorted: list[Key] = []

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, member: object) -> bool:
        return member in self._key

    def set(self, member: str, key: Key) -> None:
        current = self._key
        old = current.get(member)
        if old == key:
            return
        if key[-1] != member:
            raise ValueError(f"SortedIndex key {key!r} must end with its member {member!r}")
        entries = self._sorted
        if old is not None:
            del entries[bisect_left(entries, old)]
        current[member] = key
        insort(entries, key)

    def remove(self, member: str) -> None:
        old = self._key.pop(member, None)
        if old is not None:
            del self._sorted[bisect_left(self._sorted, old)]

    def keys(self) -> list[Key]:
        """The current keys in ascending order: the index's own list, to read, not to change."""
        return self._sorted

    def smallest(self, k: int) -> list[str]:
        return [key[-1] for key in self._sorted[:k]]

    def walk(self) -> Iterator[tuple[Key, str]]:
        return ((key, key[-1]) for key in self._sorted)
