"""Which tenant's prefill the shared PrfaaS cluster runs next: a fair share per tenant.

A tenant is a PD cluster (a destination). Jobs wait in one FIFO per tenant; when a PrfaaS
instance frees, the caller asks `pick(blocked)` for the next job, `blocked` naming tenants that
may not start one now (their egress budget is full: egress_budget.py). No clock, no sockets: the
simulator and a live PrfaaS scheduler call the same object.

- `DeficitRoundRobin` (Shreedhar & Varghese; Dynamo's router uses it with uncached tokens as the
  cost), in the form Linux's fq_codel uses (RFC 8290): a tenant may start its head job while its
  deficit is positive, and the job's cost (its uncached tokens) is then subtracted, possibly
  into debt; a tenant in debt gets its quantum (weight x `quantum_tokens`) and goes to the back
  of the turn. A tenant that becomes active after being idle starts with one quantum in a "new"
  list served before the backlogged ones, so a light tenant's job does not wait for its deficit
  to build up behind a backlogged heavy one (a prefill is seconds long and not preemptible),
  while over a busy period each backlogged tenant still receives uncached tokens in proportion
  to its weight (the debt is at most one job). A blocked tenant keeps its place and deficit.
- `FirstComeFirstServed`: the oldest job of any tenant (no fair share; the negative control).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prfaas.core.errors import ConfigError, UnknownNameError

J = TypeVar("J")


@dataclass(frozen=True, slots=True)
class _Queued(Generic[J]):
    job: J
    cost_tokens: float
    seq: int


class SharePolicy(ABC, Generic[J]):
    """One queue per tenant; `pick` chooses the next job to start."""

    def __init__(self, tenants: Collection[str]) -> None:
        if not tenants:
            raise ConfigError("tenants", list(tenants), "need at least one tenant")
        self.tenants = tuple(tenants)
        self._queues: dict[str, deque[_Queued[J]]] = {t: deque() for t in self.tenants}
        self._seq = 0

    def push(self, tenant: str, job: J, cost_tokens: float) -> None:
        if tenant not in self._queues:
            raise UnknownNameError("tenant", tenant, list(self.tenants))
        if not cost_tokens >= 0:
            raise ConfigError("cost_tokens", cost_tokens, "must be >= 0")
        self._queues[tenant].append(_Queued(job, cost_tokens, self._seq))
        self._seq += 1

    def queued(self, tenant: str) -> int:
        return len(self._queues[tenant])

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @abstractmethod
    def pick(self, blocked: Collection[str] = ()) -> tuple[str, J] | None:
        """The next (tenant, job), removed from its queue; None when every tenant with a job
        queued is blocked (or nothing is queued)."""


class FirstComeFirstServed(SharePolicy[J]):
    def pick(self, blocked: Collection[str] = ()) -> tuple[str, J] | None:
        heads = [(q[0].seq, t) for t, q in self._queues.items() if q and t not in blocked]
        if not heads:
            return None
        _, tenant = min(heads)
        return tenant, self._queues[tenant].popleft().job


class DeficitRoundRobin(SharePolicy[J]):
    """DRR in the form of Linux fq_codel (RFC 8290, "DRR++"), costs in uncached tokens."""

    def __init__(self, weights: Mapping[str, float], quantum_tokens: float = 8192.0) -> None:
        super().__init__(list(weights))
        for t, w in weights.items():
            if not w > 0:
                raise ConfigError(f"weights.{t}", w, "a tenant weight must be positive")
        if not quantum_tokens > 0:
            raise ConfigError("quantum_tokens", quantum_tokens, "must be positive")
        top = max(weights.values())
        self.quantum = {t: quantum_tokens * w / top for t, w in weights.items()}
        self.deficit = dict.fromkeys(self.tenants, 0.0)
        self._new: deque[str] = deque()  # tenants that just became active
        self._old: deque[str] = deque()  # backlogged tenants, in turn

    def push(self, tenant: str, job: J, cost_tokens: float) -> None:
        super().push(tenant, job, cost_tokens)
        if tenant not in self._new and tenant not in self._old:
            self._new.append(tenant)
            self.deficit[tenant] = self.quantum[tenant]

    def pick(self, blocked: Collection[str] = ()) -> tuple[str, J] | None:
        while True:
            lst = self._first_list(blocked)
            if lst is None:
                return None
            tenant = next(t for t in lst if t not in blocked)
            queue = self._queues[tenant]
            if not queue:  # went idle: forget it (a new arrival starts a fresh turn)
                lst.remove(tenant)
                continue
            if self.deficit[tenant] <= 0:
                self._skip_rounds(blocked)
                if self.deficit[tenant] <= 0:
                    self.deficit[tenant] += self.quantum[tenant]
                    lst.remove(tenant)
                    self._old.append(tenant)
                    continue
            item = queue.popleft()
            self.deficit[tenant] -= item.cost_tokens
            return tenant, item.job

    def _first_list(self, blocked: Collection[str]) -> deque[str] | None:
        for lst in (self._new, self._old):
            if any(t not in blocked for t in lst):
                return lst
        return None

    def _skip_rounds(self, blocked: Collection[str]) -> None:
        """When every ready backlogged tenant is in debt (deficit <= 0), grant at once the
        whole rounds in which none could start a job (what the loop would do one visit at a
        time): a cost far above the quanta then costs O(tenants), not O(cost / quantum)."""
        ready = [t for t in self._old if t not in blocked and self._queues[t]]
        if self._new or not ready or any(self.deficit[t] > 0 for t in ready):
            return
        rounds = min(int(-self.deficit[t] // self.quantum[t]) for t in ready)
        for t in ready:
            self.deficit[t] += rounds * self.quantum[t]


def make_share_policy(name: str, weights: Mapping[str, float], quantum_tokens: float = 8192.0
                      ) -> SharePolicy[J]:
    """`drr` (deficit round robin with these weights) or `fcfs` (weights unused)."""
    if name == "drr":
        return DeficitRoundRobin(weights, quantum_tokens)
    if name == "fcfs":
        return FirstComeFirstServed(list(weights))
    raise UnknownNameError("share policy", name, ["drr", "fcfs"])
