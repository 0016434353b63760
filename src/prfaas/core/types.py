"""Small frozen types that components exchange: requests as the policy sees them, the cluster
state it reads (`ClusterView`), and the `RouteDecision` it returns.

The same types are filled by the simulator (from simulated instances) and by the live router
(from worker reports), so one policy object serves both worlds.

Down parts: a down instance is simply absent from `ClusterView.instances` (the membership layer
live, scheduled outages in the simulator); a down inter-cluster link is `LinkStatus.up=False`
(a capacity of 0 counts as down too: `link_usable`). The instances of the PrfaaS cluster stay
listed while the link is down, so a view reports what is wrong, and the policies treat the
PrfaaS cluster as unreachable (`policy.base.prefill_pools`). A decision that no path can serve
is `RouteDecision.no_path` (rejected and `unavailable`: HTTP 503 live), distinct from an
admission rejection (`RouteDecision.reject`: 429).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from prfaas.core.frozen import fast_init

PRFAAS_CLUSTER = "prfaas"
PD_CLUSTER = "pd"

Role = Literal["prefill", "decode"]


class Route(StrEnum):
    PRFAAS = "prfaas"  # prefill on the remote PrfaaS cluster, KV crosses the inter-DC link
    PD = "pd"  # prefill on a local PD-P instance


@fast_init
@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a policy knows of a request when it arrives."""

    request_id: str
    input_tokens: int
    output_tokens: int
    arrival_s: float
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks


@fast_init
@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One instance's state as the scheduler sees it."""

    instance_id: str
    cluster: str  # "prfaas" or "pd"
    role: Role
    queued_requests: int = 0
    queued_work_s: float = 0.0  # estimated time to drain what is queued or running
    running: int = 0
    free_slots: int = 0  # decode: batch slots not taken (incl. reserved)


@fast_init
@dataclass(frozen=True, slots=True)
class LinkStatus:
    """The inter-cluster link as last measured."""

    capacity_gbps: float  # current estimate of what the link can carry
    egress_gbps: float = 0.0  # recent measured egress (sliding window)
    pending_bytes: float = 0.0  # queued, not yet sent
    retransmits: int = 0
    up: bool = True  # False: the link is down (partitioned); nothing crosses it


def link_usable(link: LinkStatus) -> bool:
    """KV (and prefixes) can cross the link: it is up and has some capacity."""
    return link.up and link.capacity_gbps > 0


class ClusterView(Protocol):
    """Read-only view of the system for a policy; time comes in as `now_s`."""

    @property
    def now_s(self) -> float: ...

    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]: ...

    def link(self) -> LinkStatus: ...

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        """Predicted service time of a prefill on that instance (from its profile)."""
        ...

    def kv_transfer_s(self, tokens: int) -> float:
        """Predicted time to move the KV of `tokens` tokens across the inter-cluster link."""
        ...


@fast_init
@dataclass(frozen=True, slots=True)
class RouteQuery:
    """A request plus the cached-prefix length (tokens) at each instance that has any."""

    request: RequestInfo
    cached_tokens: Mapping[str, int] = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request's prefill and decode run, and what cache it reuses or moves."""

    route: Route
    prefill_instance: str
    decode_instance: str | None
    cached_tokens: int  # prefix reused by the prefill instance
    uncached_tokens: int  # tokens the prefill instance computes
    prefix_source: str | None = None  # instance whose cache is copied to the prefill instance
    prefix_transfer_tokens: int = 0  # tokens of prefix KV moved from prefix_source
    threshold_tokens: int | None = None  # the t in force when decided
    rejected: bool = False
    reason: str = ""
    unavailable: bool = False  # rejected because no path can serve (not by admission)

    @staticmethod
    def reject(reason: str, threshold_tokens: int | None = None) -> RouteDecision:
        """Refused by admission control (the system could serve it, but not in time)."""
        return RouteDecision(Route.PD, "", None, 0, 0, threshold_tokens=threshold_tokens,
                             rejected=True, reason=reason)

    @staticmethod
    def no_path(reason: str, threshold_tokens: int | None = None) -> RouteDecision:
        """No prefill or no decode instance can serve the request now (retry later)."""
        return RouteDecision(Route.PD, "", None, 0, 0, threshold_tokens=threshold_tokens,
                             rejected=True, reason=reason, unavailable=True)


def best_cached(query: RouteQuery, instances: Sequence[InstanceLoad]) -> int:
    """Longest cached prefix (tokens) among `instances`."""
    if not query.cached_tokens:
        return 0  # (max of nothing, either way)
    from prfaas.core.pool import RankedPool  # (pool.py imports this module)

    if isinstance(instances, RankedPool):  # only the holders, looked up by name
        return max((c for name, c in query.cached_tokens.items()
                    if instances.get(name) is not None), default=0)
    return max((query.cached_tokens.get(i.instance_id, 0) for i in instances), default=0)
