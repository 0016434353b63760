"""The live router's `RankedPool`s (core/pool.py): the workers of one cluster and role that are
up, ranked by the router's own bookkeeping (serve/cluster.py), so a routing decision in front of
a thousand workers reads a few, not all, and decides exactly as a scan of the same loads.

Prefill: a worker with nothing in flight has no queued work; those are grouped by their cost
model (the same model and EWMA ratio, or the same seconds per token: the same `prefill_time_s`
for every length) and only each group's smallest name not skipped is shown. A busy worker is
ranked by `busy_until` (monotonic), whose queued work at the view's instant `now` is
max(busy_until - now, 0) >= busy_until - now less a rounding margin. The floor of
`prefill_time_s` is each model's time at its smallest ratio, and the smallest seconds per token
(products are monotone). Decode: ranked exactly by `pick_decode`'s key.
Members keep the topology's order, so a policy that scans sees what it saw before.
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Generator
from typing import Protocol

from prfaas.core.pool import RankedPool
from prfaas.core.types import InstanceLoad, Role
from prfaas.models.profile import PrefillTime
from prfaas.sim.load_index import LoadIndex
from prfaas.sim.pools import MARGIN, IdleGroups


class _Spec(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def cluster(self) -> str: ...
    @property
    def max_batch(self) -> int: ...


class _Load(Protocol):
    """What the pool reads of one worker's bookkeeping (serve/cluster.py `_Load`)."""

    @property
    def spec(self) -> _Spec: ...
    inflight: int
    busy_until: float
    seconds_per_token: float
    model: PrefillTime | None
    ratio: float


class LivePool:
    """One (cluster, role)'s members that are up, kept current by `LiveCluster`."""

    def __init__(self, role: Role, order: dict[str, int]) -> None:
        self.role = role
        self._order = order  # topology position of every worker
        self.names: list[str] = []  # members, in topology order
        self.loads: dict[str, _Load] = {}
        self._idle = IdleGroups()
        self._busy = LoadIndex()  # (busy_until, name)
        self._decode = LoadIndex()  # (-free_slots, running + queued, name)
        self._models: dict[int, tuple[PrefillTime, LoadIndex]] = {}  # (model, ratios)
        self._per_token = LoadIndex()  # (seconds_per_token, name) of workers with no model
        self._cost_ids: dict[tuple[object, ...], int] = {}

    def add(self, load: _Load) -> None:
        name = load.spec.name
        if name in self.loads:
            return
        self.loads[name] = load
        bisect.insort(self.names, name, key=self._order.__getitem__)
        self.touch(load)

    def remove(self, name: str) -> None:
        load = self.loads.pop(name, None)
        if load is None:
            return
        self.names.remove(name)
        self._idle.remove(name)
        self._busy.remove(name)
        self._decode.remove(name)
        self._per_token.remove(name)
        for _, ratios in self._models.values():
            ratios.remove(name)

    def touch(self, load: _Load) -> None:
        name = load.spec.name
        if name not in self.loads:
            return
        if self.role == "decode":
            free = max(load.spec.max_batch - load.inflight, 0)
            self._decode.set(name, (-free, 2 * load.inflight, name))
            return
        if load.model is not None:
            model = self._models.setdefault(id(load.model), (load.model, LoadIndex()))
            model[1].set(name, (load.ratio, name))
            cost: tuple[object, ...] = ("model", id(load.model), load.ratio)
        else:
            self._per_token.set(name, (load.seconds_per_token, name))
            cost = ("per_token", load.seconds_per_token)
        if load.inflight:
            self._idle.remove(name)
            self._busy.set(name, (load.busy_until, name))
        else:
            self._busy.remove(name)
            group = self._cost_ids.setdefault(cost, len(self._cost_ids))
            self._idle.set(name, 0.0, group)

    def floor_s(self, total_tokens: int, cached_tokens: int) -> float:
        floors = []
        for model, ratios in self._models.values():
            least = ratios.smallest(1)
            if least:
                floors.append(model.seconds(total_tokens, cached_tokens)
                              * self.loads[least[0]].ratio)
        least = self._per_token.smallest(1)
        if least:
            floors.append(max(total_tokens - cached_tokens, 1)
                          * self.loads[least[0]].seconds_per_token)
        return min(floors, default=0.0)


class LivePoolView(RankedPool):
    """A `LivePool` at the instant `now` (monotonic seconds) of one `LiveView`."""

    def __init__(self, pool: LivePool, now: float) -> None:
        self._pool, self._now = pool, now

    def _load(self, name: str) -> InstanceLoad:
        load = self._pool.loads[name]
        w = load.spec
        if self._pool.role == "decode":
            return InstanceLoad(name, w.cluster, "decode", queued_requests=load.inflight,
                                queued_work_s=0.0, running=load.inflight,
                                free_slots=max(w.max_batch - load.inflight, 0))
        queued = max(load.busy_until - self._now, 0.0) if load.inflight else 0.0
        return InstanceLoad(name, w.cluster, "prefill", queued_requests=load.inflight,
                            queued_work_s=queued, running=load.inflight, free_slots=0)

    def __len__(self) -> int:
        return len(self._pool.names)

    def loads(self) -> list[InstanceLoad]:
        return [self._load(n) for n in self._pool.names]

    def get(self, instance_id: str) -> InstanceLoad | None:
        return self._load(instance_id) if instance_id in self._pool.loads else None

    def prefill_floor_s(self, total_tokens: int, cached_tokens: int) -> float:
        return self._pool.floor_s(total_tokens, cached_tokens)

    def ranked(self, skip: Container[str] = ()
               ) -> Generator[tuple[float, InstanceLoad], None, None]:
        pool, now = self._pool, self._now
        if pool.role == "decode":
            walk = pool._decode.walk()
            try:
                for _, name in walk:
                    if name not in skip:
                        yield 0.0, self._load(name)
            finally:
                walk.close()
            return
        idle, busy = pool._idle.walk(skip), pool._busy.walk()
        try:
            a, b = next(idle, None), next(busy, None)
            while a is not None or b is not None:
                b_bound = 0.0
                if b is not None:
                    until = b[0][0]
                    b_bound = until - now - MARGIN * (abs(until) + abs(now) + 1.0)
                if b is None or (a is not None and a[0] <= b_bound):
                    assert a is not None
                    yield a[0], self._load(a[1])
                    a = next(idle, None)
                else:
                    if b[1] not in skip:
                        yield b_bound, self._load(b[1])
                    b = next(busy, None)
        finally:
            idle.close()
            busy.close()
