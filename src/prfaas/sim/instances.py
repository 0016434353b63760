"""Simulated instances: a prefill server with a queue, and a continuous-batching decoder.

Prefill: one request at a time, service time from the instance's `PrefillTime` profile, charged
only for the uncached part (`seconds(total, cached)`); queue order FIFO or shortest-first. An
instance that shares its cores with others (`share`, sim/sharing.py) has its running prefill's
end moved (`retime`) while the others' prefills overlap it.

Decode: up to BS_max sequences; every step emits one token per running sequence and takes
`step_at(batch)` seconds. The decoder keeps a "virtual token" clock V that advances by one per
step (at rate 1 / step_at(batch)); a sequence that joins at V0 with n tokens to emit leaves at
V0 + n. So only joins and leaves are events, whatever the output length, and a step time that
depends on the batch size is exact between events.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from prfaas.core.types import InstanceLoad, Role
from prfaas.models.profile import DecodeTime, PrefillTime

if TYPE_CHECKING:
    from prfaas.sim.pools import DecodePool, PrefillPool
    from prfaas.sim.sharing import CoreGroup

PREFILL_ORDERS = ("fifo", "sjf")


def instance_id(pool: str, index: int) -> str:
    """A simulated instance's id: its pool ("prfaas-p", "pd-p", "pd-d") and index, e.g.
    prfaas-p0000 (what `SystemConfig.core_groups` and placements name)."""
    return f"{pool}{index:04d}"


class PrefillInstance:
    def __init__(self, instance_id: str, cluster: str, profile: PrefillTime,
                 order: str = "fifo", start_s: float = 0.0) -> None:
        self.instance_id = instance_id
        self.cluster = cluster
        self.index = 0  # position in the simulator's list (fits in an event tuple)
        self.profile = profile
        self.sjf = order == "sjf"
        self._fifo: deque[tuple[int, float]] = deque()
        self._heap: list[tuple[float, int]] = []
        self.queued_service_s = 0.0
        self.running = -1  # request index, -1 when idle
        self.busy_until_s = 0.0
        self.busy_s = 0.0
        self.served_s = 0.0  # service time of finished prefills (busy_s counts on start)
        self._running_s = 0.0
        self.done = 0
        self.held = 0  # routed here, waiting for a prefix move before they queue
        self.start_s = start_s  # joined its role (a rebalanced instance joins mid-run)
        self.end_s: float | None = None  # left its role
        self.version = 0  # bumped when it goes down: its pending prefill-done is void
        self.down = False
        self.pool: PrefillPool | None = None  # the ranked pool routing sees it in, if any
        self.share: CoreGroup | None = None  # instances it shares cores with (sim/sharing.py)

    def __len__(self) -> int:
        return len(self._heap) if self.sjf else len(self._fifo)

    def retime(self, end_s: float) -> None:
        """Its running prefill now ends at `end_s` (a core shared with more or fewer running
        prefills, sim/sharing.py): busy time and drain follow; the pending prefill-done is
        void (`version`)."""
        self.busy_s += end_s - self.busy_until_s
        self.busy_until_s = end_s
        self.version += 1

    def abort(self, now_s: float) -> list[int]:
        """Going down: the running and queued requests, in order; the instance is left empty
        (what waits for a prefix move is the simulator's to re-run)."""
        lost = [self.running] if self.running >= 0 else []
        if self.running >= 0:
            self.busy_s -= max(self.busy_until_s - now_s, 0.0)  # charged whole at start
        queued = [r for _, r in sorted(self._heap)] if self.sjf else [r for r, _ in self._fifo]
        self._fifo.clear()
        self._heap.clear()
        self.queued_service_s = 0.0
        self.running = -1
        self.version += 1
        return lost + queued

    def enqueue(self, req: int, service_s: float) -> None:
        self.queued_service_s += service_s
        if self.sjf:
            heapq.heappush(self._heap, (service_s, req))
        else:
            self._fifo.append((req, service_s))

    def start_next(self, now_s: float) -> tuple[int, float] | None:
        """Take the next queued request; returns (request, finish time) or None if empty."""
        if self.sjf:
            if not self._heap:
                return None
            service_s, req = heapq.heappop(self._heap)
        else:
            if not self._fifo:
                return None
            req, service_s = self._fifo.popleft()
        self.queued_service_s -= service_s
        self.running = req
        self.busy_until_s = now_s + service_s
        self.busy_s += service_s
        self._running_s = service_s
        return req, self.busy_until_s

    def finish(self) -> int:
        req, self.running = self.running, -1
        self.done += 1
        self.served_s += self._running_s
        return req

    def idle(self) -> bool:
        """Nothing running, queued or on its way (a draining instance may leave)."""
        return self.running < 0 and not len(self) and not self.held

    def order_key(self) -> tuple[float, str]:
        """Orders instances like (drain_s(now), id) for any now: an idle one drains at once,
        a busy one when its running and queued work is done (absolute time)."""
        if self.running < 0:
            return (-1.0, self.instance_id)
        return (self.busy_until_s + self.queued_service_s, self.instance_id)

    def drain_s(self, now_s: float) -> float:
        """Predicted time to finish what is running and queued."""
        running = self.busy_until_s - now_s if self.running >= 0 else 0.0
        return max(running, 0.0) + self.queued_service_s

    def load(self, now_s: float) -> InstanceLoad:
        # (drain_s and __len__ inlined: the same operations, read on every routing decision)
        if self.running >= 0:
            drain = max(self.busy_until_s - now_s, 0.0) + self.queued_service_s
        else:
            drain = 0.0 + self.queued_service_s
        return InstanceLoad(self.instance_id, self.cluster, "prefill",
                            len(self._heap) if self.sjf else len(self._fifo), drain,
                            1 if self.running >= 0 else 0, 0)


class DecodeInstance:
    def __init__(self, instance_id: str, cluster: str, profile: DecodeTime,
                 start_s: float = 0.0) -> None:
        self.instance_id = instance_id
        self.cluster = cluster
        self.role: Role = "decode"
        self.index = 0
        self.profile = profile
        self.bs_max = profile.bs_max
        self._const_step_s = profile.step_s if not profile.batch_points else 0.0
        self._virtual = 0.0  # tokens each running sequence has emitted since t = 0
        self._running: list[tuple[float, int]] = []  # (virtual finish, request)
        self.waiting: deque[int] = deque()  # KV arrived, no free slot yet
        self.inflight = 0  # routed here, KV not yet arrived
        self.version = 0
        self.slot_s = 0.0  # integral of batch size over time (for utilisation)
        self.done = 0
        self.start_s = start_s
        self.end_s: float | None = None
        self._last_s = start_s
        self.down = False
        self.pool: DecodePool | None = None  # the ranked pool routing sees it in, if any

    def abort(self, now_s: float) -> list[tuple[int, float]]:
        """Going down: (request, steps still to run) for every running sequence, then
        (request, inf) for those waiting for a slot; the instance is left empty."""
        self.advance(now_s)
        running = sorted(self._running, key=lambda e: e[1])
        out = [(req, finish - self._virtual) for finish, req in running]
        out += [(req, float("inf")) for req in self.waiting]
        self._running.clear()
        self.waiting.clear()
        self.inflight = 0
        self.version += 1
        return out

    @property
    def batch(self) -> int:
        return len(self._running)

    def step_s(self) -> float:
        return self._const_step_s or self.profile.step_at(max(len(self._running), 1))

    def advance(self, now_s: float) -> None:
        dt = now_s - self._last_s
        running = self._running
        if dt > 0 and running:
            self._virtual += dt / (self._const_step_s or self.profile.step_at(len(running)))
            self.slot_s += dt * len(running)
        self._last_s = now_s

    def slot_s_at(self, now_s: float) -> float:
        """`slot_s` brought up to `now_s` without moving the clocks (a read-only probe)."""
        return self.slot_s + max(now_s - self._last_s, 0.0) * len(self._running)

    def has_slot(self) -> bool:
        return len(self._running) < self.bs_max

    def join(self, now_s: float, req: int, tokens: int) -> None:
        self.advance(now_s)
        heapq.heappush(self._running, (self._virtual + tokens, req))
        self.version += 1

    def next_finish_s(self) -> float | None:
        running = self._running
        if not running:
            return None
        return self._last_s + max(running[0][0] - self._virtual, 0.0) * (
            self._const_step_s or self.profile.step_at(len(running)))

    def pop_finished(self, now_s: float) -> list[int]:
        self.advance(now_s)
        done: list[int] = []
        eps = 1e-9 * max(1.0, self._virtual)
        while self._running and self._running[0][0] <= self._virtual + eps:
            done.append(heapq.heappop(self._running)[1])
        if done:
            self.version += 1
            self.done += len(done)
        return done

    def occupancy(self) -> int:
        """Sequences running, waiting for a slot, or with KV on the way."""
        return len(self._running) + len(self.waiting) + self.inflight

    def idle(self) -> bool:
        return not self._running and not self.waiting and not self.inflight

    def order_key(self) -> tuple[int, str]:
        """Orders decoders like (-free_slots, occupancy, id): with one BS_max, both are
        increasing in occupancy."""
        return (self.occupancy(), self.instance_id)

    def rank_key(self) -> tuple[int, int, str]:
        """(-free_slots, occupancy, id): `pick_decode`'s order, computed at once."""
        occupancy = len(self._running) + len(self.waiting) + self.inflight
        free = self.bs_max - occupancy
        return (-free if free > 0 else 0, occupancy, self.instance_id)

    def free_slots(self) -> int:
        return max(self.bs_max - len(self._running) - len(self.waiting) - self.inflight, 0)

    def load(self, now_s: float) -> InstanceLoad:
        running, queued = len(self._running), len(self.waiting) + self.inflight
        free = self.bs_max - running - len(self.waiting) - self.inflight  # free_slots()
        return InstanceLoad(self.instance_id, self.cluster, "decode", queued, 0.0, running,
                            free if free > 0 else 0)
