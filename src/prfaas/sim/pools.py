"""The simulator's `RankedPool`s (core/pool.py): one per (cluster, role), kept current by
`SimView` when an instance's queue or batch changes.

Prefill: idle instances are ranked by their exact queued work (nothing running: the drain time
is `queued_service_s`, whatever the time; of those with the same work and profile only the
smallest name not skipped is shown, `IdleGroups`), busy ones by their absolute drain time
K = busy_until + queued, whose queued work at `now` is (busy_until - now) + queued >= K - now
less a rounding margin (float error of a few ulps of K and now; the margin is ~1e3 times that).
Decode: ranked exactly by `pick_decode`'s key (-free_slots, occupancy, id), which needs no time.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Container, Generator

from prfaas.core.pool import RankedPool
from prfaas.core.types import InstanceLoad
from prfaas.models.profile import PrefillTime
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.load_index import BucketIndex, LoadIndex, SortedIndex

MARGIN = 1e-12  # relative to |K| + |now| + 1 s


class IdleGroups:
    """Idle prefill instances grouped by (queued work, profile): within a group every member
    costs a policy the same, so only its smallest name not in `skip` can win (core/pool.py).
    `walk(skip)` yields (queued work, that name) per group, groups in ascending order."""

    def __init__(self) -> None:
        self._group_of: dict[str, tuple[float, int]] = {}
        self._members: dict[tuple[float, int], list[str]] = {}  # sorted names per group
        self._heap: list[tuple[float, int]] = []  # group keys, lazily (empty groups dropped)

    def __bool__(self) -> bool:
        return bool(self._group_of)

    def groups(self) -> int:
        return len(self._members)

    def set(self, name: str, queued_s: float, profile_id: int) -> None:
        group = (queued_s, profile_id)
        old = self._group_of.get(name)
        if old == group:
            return
        if old is not None:
            self.remove(name)
        self._group_of[name] = group
        members = self._members.get(group)
        if members is None:
            members = self._members[group] = []
            heapq.heappush(self._heap, group)
            if len(self._heap) > 4 * len(self._members) + 64:  # drop stale group keys
                self._heap = list(self._members)
                heapq.heapify(self._heap)
        insort(members, name)

    def remove(self, name: str) -> None:
        group = self._group_of.pop(name, None)
        if group is None:
            return
        members = self._members[group]
        del members[bisect_left(members, name)]
        if not members:
            del self._members[group]  # its heap entry goes stale

    def peek(self, skip: Container[str]) -> tuple[float, str] | None:
        """What `walk(skip)` yields first when that is the smallest group's smallest name
        (read in place); None when it is not (no member, or that name is skipped)."""
        heap, live = self._heap, self._members
        while heap and heap[0] not in live:
            heapq.heappop(heap)  # empty since
        if not heap:
            return None
        group = heap[0]
        first = live[group][0]
        return (group[0], first) if first not in skip else None

    def walk(self, skip: Container[str]) -> Generator[tuple[float, str], None, None]:
        heap, live = self._heap, self._members
        taken: list[tuple[float, int]] = []
        try:
            while heap:
                group = heap[0]
                if group not in live or (taken and taken[-1] == group):
                    heapq.heappop(heap)  # empty since, or a duplicate entry
                    continue
                first = next((n for n in live[group] if n not in skip), None)
                if first is not None:
                    yield group[0], first
                taken.append(heapq.heappop(heap))
        finally:
            for group in taken:
                heapq.heappush(heap, group)


class PrefillPool(RankedPool):
    def __init__(self, clock: Callable[[], float]) -> None:
        self._now = clock
        self.members: list[PrefillInstance] = []
        self._by_id: dict[str, PrefillInstance] = {}
        self._idle = IdleGroups()
        self._busy = SortedIndex()  # (busy_until_s + queued_service_s, id)
        self._profiles: Counter[int] = Counter()  # by id(): members per distinct profile
        self._profile: dict[int, PrefillTime] = {}
        self._floors: tuple[PrefillTime, ...] = ()  # the distinct profiles

    def add(self, p: PrefillInstance) -> None:
        self.members.append(p)
        self._by_id[p.instance_id] = p
        self._profiles[id(p.profile)] += 1
        self._profile[id(p.profile)] = p.profile
        self._floors = tuple(self._profile.values())
        p.pool = self
        self.touch(p)

    def remove(self, p: PrefillInstance) -> None:
        self.members.remove(p)
        del self._by_id[p.instance_id]
        self._profiles[id(p.profile)] -= 1
        if not self._profiles[id(p.profile)]:
            del self._profiles[id(p.profile)], self._profile[id(p.profile)]
            self._floors = tuple(self._profile.values())
        p.pool = None
        self._idle.remove(p.instance_id)
        self._busy.remove(p.instance_id)

    def touch(self, p: PrefillInstance) -> None:
        name = p.instance_id
        if p.running < 0:
            self._busy.remove(name)
            self._idle.set(name, p.queued_service_s, id(p.profile))
        else:
            self._idle.remove(name)
            self._busy.set(name, (p.busy_until_s + p.queued_service_s, name))

    def __contains__(self, p: object) -> bool:
        return isinstance(p, PrefillInstance) and self._by_id.get(p.instance_id) is p

    # -- RankedPool -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.members)

    def __bool__(self) -> bool:  # (policies test pools several times per decision)
        return bool(self.members)

    def loads(self) -> list[InstanceLoad]:
        now = self._now()
        return [p.load(now) for p in self.members]

    def get(self, instance_id: str) -> InstanceLoad | None:
        p = self._by_id.get(instance_id)
        return p.load(self._now()) if p is not None else None

    def prefill_floor_s(self, total_tokens: int, cached_tokens: int) -> float:
        floors = self._floors
        if len(floors) == 1:  # (the common pool: one hardware)
            return floors[0].seconds(total_tokens, cached_tokens)
        return min((f.seconds(total_tokens, cached_tokens) for f in floors), default=0.0)

    def ranked(self, skip: Container[str] = ()
               ) -> Generator[tuple[float, InstanceLoad], None, None]:
        now = self._now()
        by_id = self._by_id
        # the first idle and the first busy member are peeked in place; a walk (which pops
        # and pushes back heap entries) starts only when the reader goes past one of them,
        # and most decisions stop at the first idle member or the first busy one
        idle: Generator[tuple[float, str], None, None] | None = None
        try:
            a = self._idle.peek(skip) if self._idle else None
            if a is None and self._idle:
                idle = self._idle.walk(skip)
                a = next(idle, None)
            peeked = a is not None and idle is None
            busy = self._busy.keys()  # (drain end, id), ascending; read in place
            j = 0
            b = busy[0] if busy else None
            b_bound = 0.0
            if b is not None:
                b_bound = b[0] - now - MARGIN * (abs(b[0]) + abs(now) + 1.0)
            while a is not None or b is not None:
                if b is None or (a is not None and a[0] <= b_bound):
                    assert a is not None
                    yield a[0], by_id[a[1]].load(now)
                    if peeked:
                        peeked = False
                        if self._idle.groups() == 1:  # the only group: nothing follows
                            a = None
                            continue
                        idle = self._idle.walk(skip)
                        next(idle)  # the same first member, read in place
                    assert idle is not None
                    a = next(idle, None)
                else:
                    if b[1] not in skip:
                        yield b_bound, by_id[b[1]].load(now)
                    j += 1
                    b = busy[j] if j < len(busy) else None
                    if b is not None:
                        b_bound = b[0] - now - MARGIN * (abs(b[0]) + abs(now) + 1.0)
        finally:
            if idle is not None:
                idle.close()


class DecodePool(RankedPool):
    def __init__(self, clock: Callable[[], float]) -> None:
        self._now = clock
        self.members: list[DecodeInstance] = []
        self._by_id: dict[str, DecodeInstance] = {}
        # one BS_max for all (the simulator's pools): (-free_slots, occupancy, id) orders as
        # (occupancy, id), kept in buckets; otherwise a LoadIndex keyed by the whole tuple
        self._bs_max: int | None = None
        self._buckets: BucketIndex | None = BucketIndex()
        self._index = LoadIndex()

    def add(self, d: DecodeInstance) -> None:
        self.members.append(d)
        self._by_id[d.instance_id] = d
        d.pool = self
        if self._bs_max is None:
            self._bs_max = d.bs_max
        elif d.bs_max != self._bs_max and self._buckets is not None:
            self._buckets = None  # mixed batch limits: rank by the whole key from now on
            for m in self.members:
                self._index.set(m.instance_id, m.rank_key())
        self.touch(d)

    def remove(self, d: DecodeInstance) -> None:
        self.members.remove(d)
        del self._by_id[d.instance_id]
        d.pool = None
        if self._buckets is not None:
            self._buckets.remove(d.instance_id)
        self._index.remove(d.instance_id)

    def touch(self, d: DecodeInstance) -> None:
        if self._buckets is not None:
            self._buckets.set(d.instance_id, d.occupancy())
        else:
            self._index.set(d.instance_id, d.rank_key())

    def __contains__(self, d: object) -> bool:
        return isinstance(d, DecodeInstance) and self._by_id.get(d.instance_id) is d

    def __len__(self) -> int:
        return len(self.members)

    def __bool__(self) -> bool:
        return bool(self.members)

    def loads(self) -> list[InstanceLoad]:
        now = self._now()
        return [d.load(now) for d in self.members]

    def get(self, instance_id: str) -> InstanceLoad | None:
        d = self._by_id.get(instance_id)
        return d.load(self._now()) if d is not None else None

    def prefill_floor_s(self, total_tokens: int, cached_tokens: int) -> float:
        return 0.0

    def first(self) -> InstanceLoad | None:
        buckets = self._buckets
        member = buckets.first() if buckets is not None else self._index.first()
        return self._by_id[member].load(self._now()) if member is not None else None

    def ranked(self, skip: Container[str] = ()
               ) -> Generator[tuple[float, InstanceLoad], None, None]:
        now = self._now()
        if self._buckets is not None:
            for member in self._buckets.walk():
                if member not in skip:
                    yield 0.0, self._by_id[member].load(now)
            return
        walk = self._index.walk()
        try:
            for _, member in walk:
                if member not in skip:
                    yield 0.0, self._by_id[member].load(now)
        finally:
            walk.close()
