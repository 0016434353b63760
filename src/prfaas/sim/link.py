"""The inter-cluster link: capacity B(t) shared max-min fairly by concurrent transfers.

Every transfer has the same per-flow cap (`connections` x `per_connection_gbps`, or none), so
max-min fairness gives each of the n active flows min(cap, B(t) / n): processor sharing. The
link keeps a per-flow "virtual bytes" clock W that advances at that rate; a flow of b bytes that
starts at W0 finishes when W reaches W0 + b. A join, a finish or a capacity change costs
O(log n), with no per-byte or per-packet events.

`FifoLink` is the other order a sender can have: one transfer at a time, in the order they
started, each at min(cap, B(t)). It is how the vLLM connector sends (integrations/vllm/link.py:
one ordered queue per destination, so a transfer's layers wait behind every layer queued before
them), where the native prefill worker interleaves concurrent transfers on its connections
(processor sharing). `make_link` picks one by name (`LINK_ORDERS`).

`LinkSchedule` is B(t): constant, or piecewise constant from [(start_s, gbps), ...].
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.scenario import LINK_ORDERS

BYTES_PER_GBPS = 1e9 / 8


@dataclass(frozen=True)
class LinkSchedule:
    """Piecewise-constant capacity: `gbps[i]` from `start_s[i]` until the next start."""

    start_s: tuple[float, ...]
    gbps: tuple[float, ...]

    @staticmethod
    def constant(gbps: float) -> LinkSchedule:
        return LinkSchedule.piecewise([(0.0, gbps)])

    @staticmethod
    def piecewise(points: Sequence[tuple[float, float]]) -> LinkSchedule:
        if not points:
            raise ConfigError("link.schedule", points, "need at least one (start_s, gbps) point")
        pts = sorted((float(t), float(g)) for t, g in points)
        if pts[0][0] > 0:
            raise ConfigError("link.schedule", points, "the first point must start at 0 s")
        for t, g in pts:
            if not g > 0:
                raise ConfigError("link.schedule", (t, g), "capacity must be positive Gbps")
        return LinkSchedule(tuple(t for t, _ in pts), tuple(g for _, g in pts))

    def at(self, time_s: float) -> float:
        return self.gbps[max(bisect_right(self.start_s, time_s) - 1, 0)]

    def next_change_s(self, time_s: float) -> float | None:
        i = bisect_right(self.start_s, time_s)
        return self.start_s[i] if i < len(self.start_s) else None


class _Link(ABC):
    """What both link orders share: the capacity B(t), the per-flow cap and the counters."""

    def __init__(self, schedule: LinkSchedule, flow_cap_gbps: float | None = None) -> None:
        if flow_cap_gbps is not None and not flow_cap_gbps > 0:
            raise ConfigError("link.per_connection_gbps", flow_cap_gbps, "must be positive")
        self.schedule = schedule
        self.flow_cap_bps = flow_cap_gbps * BYTES_PER_GBPS if flow_cap_gbps else float("inf")
        self._capacity_bps = schedule.at(0.0) * BYTES_PER_GBPS
        self._last_s = 0.0
        self.version = 0  # bumped whenever the next finish time may have moved
        self.busy_s = 0.0  # time with at least one flow
        self.bytes_sent = 0.0

    def capacity_gbps(self) -> float:
        return self._capacity_bps / BYTES_PER_GBPS

    @abstractmethod
    def advance(self, now_s: float) -> None:
        """Bring the flows' progress to `now_s` at the current rates."""

    def set_capacity(self, now_s: float, gbps: float) -> None:
        self.advance(now_s)
        self._capacity_bps = gbps * BYTES_PER_GBPS
        self.version += 1


class SharedLink(_Link):
    """Processor-sharing link. The caller schedules `next_finish_s()` and calls `pop_finished`."""

    def __init__(self, schedule: LinkSchedule, flow_cap_gbps: float | None = None) -> None:
        super().__init__(schedule, flow_cap_gbps)
        self._virtual = 0.0  # bytes each active flow has been able to send so far
        self._flows: list[tuple[float, int]] = []  # (virtual finish, flow id)

    @property
    def active(self) -> int:
        return len(self._flows)

    def flow_rate_bps(self) -> float:
        n = len(self._flows)
        return min(self.flow_cap_bps, self._capacity_bps / n) if n else \
            min(self.flow_cap_bps, self._capacity_bps)

    def egress_bps(self) -> float:
        """What the link carries now, all flows together."""
        return self.flow_rate_bps() * len(self._flows)

    def advance(self, now_s: float) -> None:
        dt = now_s - self._last_s
        if dt > 0 and self._flows:
            rate = self.flow_rate_bps()
            self._virtual += rate * dt
            self.busy_s += dt
            self.bytes_sent += rate * dt * len(self._flows)
        self._last_s = now_s

    def start(self, now_s: float, flow_id: int, size_bytes: float) -> None:
        self.advance(now_s)
        heapq.heappush(self._flows, (self._virtual + max(size_bytes, 0.0), flow_id))
        self.version += 1

    def cancel(self, now_s: float, flow_ids: set[int]) -> int:
        """Drop these flows (their sender or the link went down); returns how many were on."""
        self.advance(now_s)
        kept = [f for f in self._flows if f[1] not in flow_ids]
        dropped = len(self._flows) - len(kept)
        if dropped:
            heapq.heapify(kept)
            self._flows = kept
            self.version += 1
        return dropped

    def next_finish_s(self) -> float | None:
        if not self._flows:
            return None
        left = self._flows[0][0] - self._virtual
        return self._last_s + max(left, 0.0) / self.flow_rate_bps()

    def pop_finished(self, now_s: float) -> list[int]:
        """Flows done by `now_s` (a relative tolerance absorbs float rounding)."""
        self.advance(now_s)
        done: list[int] = []
        eps = 1e-9 * max(1.0, self._virtual)
        while self._flows and self._flows[0][0] <= self._virtual + eps:
            done.append(heapq.heappop(self._flows)[1])
        if done:
            self.version += 1
        return done


class FifoLink(_Link):
    """One transfer at a time in start order, at min(cap, B(t)); the same interface as
    `SharedLink`. Bytes a finished head leaves unused within an interval go to the next flow
    (work-conserving), so an event processed late loses no capacity."""

    def __init__(self, schedule: LinkSchedule, flow_cap_gbps: float | None = None) -> None:
        super().__init__(schedule, flow_cap_gbps)
        self._queue: deque[list[float]] = deque()  # [bytes left, flow id, size], start order

    @property
    def active(self) -> int:
        return len(self._queue)

    def flow_rate_bps(self) -> float:
        """The head's rate (every flow's, once it is the head)."""
        return min(self.flow_cap_bps, self._capacity_bps)

    def egress_bps(self) -> float:
        return self.flow_rate_bps() if self._queue else 0.0

    def advance(self, now_s: float) -> None:
        dt = now_s - self._last_s
        if dt > 0 and self._queue:
            rate = self.flow_rate_bps()
            budget = rate * dt
            for flow in self._queue:
                take = min(max(flow[0], 0.0), budget)
                flow[0] -= take
                budget -= take
                if budget <= 0:
                    break
            sent = rate * dt - budget
            self.bytes_sent += sent
            self.busy_s += sent / rate
        self._last_s = now_s

    def start(self, now_s: float, flow_id: int, size_bytes: float) -> None:
        self.advance(now_s)
        self._queue.append([max(size_bytes, 0.0), float(flow_id), max(size_bytes, 0.0)])
        self.version += 1

    def cancel(self, now_s: float, flow_ids: set[int]) -> int:
        self.advance(now_s)
        kept = [f for f in self._queue if int(f[1]) not in flow_ids]
        dropped = len(self._queue) - len(kept)
        if dropped:
            self._queue = deque(kept)
            self.version += 1
        return dropped

    def next_finish_s(self) -> float | None:
        if not self._queue:
            return None
        return self._last_s + max(self._queue[0][0], 0.0) / self.flow_rate_bps()

    def pop_finished(self, now_s: float) -> list[int]:
        """Flows done by `now_s` (a tolerance relative to the flow's size absorbs rounding)."""
        self.advance(now_s)
        done: list[int] = []
        while self._queue and self._queue[0][0] <= 1e-9 * max(1.0, self._queue[0][2]):
            done.append(int(self._queue.popleft()[1]))
        if done:
            self.version += 1
        return done


def make_link(schedule: LinkSchedule, flow_cap_gbps: float | None = None,
              order: str = "shared") -> SharedLink | FifoLink:
    """The inter-cluster link with its transfers in `order`: "shared" (processor sharing,
    the native worker) or "fifo" (one at a time, the vLLM connector)."""
    if order == "shared":
        return SharedLink(schedule, flow_cap_gbps)
    if order == "fifo":
        return FifoLink(schedule, flow_cap_gbps)
    raise UnknownNameError("link.order", order, list(LINK_ORDERS))
