"""`RankedPool`: one cluster's instances of one role, as a view that keeps them ranked by load.

A `ClusterView` may answer `instances(cluster, role)` with a `RankedPool` instead of a list. It
is still a `Sequence[InstanceLoad]` (members in the view's own order, loads at `view.now_s`),
so a policy that scans it decides as before; the shipped policies' helpers (policy/base.py,
policy/cache_aware.py) use three more calls to read only the members that can win:

- `get(instance_id)`: a member's load, or None (a cached prefix's holder, looked up by name);
- `ranked(skip)`: the members not named in `skip`, in ascending order of a lower bound on
  `queued_work_s` (prefill pools), or exactly in `pick_decode`'s order (-free_slots,
  running + queued_requests, id) with bound 0.0 (decode pools), yielded lazily as
  (bound, load). A prefill pool may leave out a member when one it yields has the same
  `queued_work_s`, the same `prefill_time_s` for every length and a smaller name: it would
  lose every tie (same cost, same cache: both are outside `skip`, which names the holders);
- `prefill_floor_s(total, cached)`: a lower bound on `prefill_time_s` of any member.

A policy's min over the pool is then a branch and bound: holders of a cached prefix are costed
exactly, then the rest in `ranked()` order until the lower bound of what is left exceeds the best
cost found (strictly: equal costs are still read, so ties break by name exactly as a full scan).
Float sums are monotone, so bound + floor <= the exact cost holds after rounding too.
A view keeps the ranking current when an instance's state changes (O(log n)); a decision reads
O(k) members, k = holders + those within the bound, not O(n).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Container, Generator, Iterator, Sequence
from typing import overload

from prfaas.core.types import InstanceLoad


class RankedPool(Sequence[InstanceLoad]):
    """See the module docstring; `loads()` is the whole pool, in the view's order."""

    @abstractmethod
    def loads(self) -> list[InstanceLoad]: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def get(self, instance_id: str) -> InstanceLoad | None: ...

    @abstractmethod
    def ranked(self, skip: Container[str] = ()
               ) -> Generator[tuple[float, InstanceLoad], None, None]: ...

    @abstractmethod
    def prefill_floor_s(self, total_tokens: int, cached_tokens: int) -> float: ...

    def first(self) -> InstanceLoad | None:
        """What `ranked()` yields first, or None when empty (a pool may answer it faster)."""
        ranked = self.ranked()
        try:
            return next(ranked, (0.0, None))[1]
        finally:
            ranked.close()

    @overload
    def __getitem__(self, index: int) -> InstanceLoad: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[InstanceLoad]: ...

    def __getitem__(self, index: int | slice) -> InstanceLoad | Sequence[InstanceLoad]:
        return self.loads()[index]

    def __iter__(self) -> Iterator[InstanceLoad]:
        return iter(self.loads())

    def __bool__(self) -> bool:
        return len(self) > 0
