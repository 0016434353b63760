"""A small scripted ClusterView and request factory for the policy tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prfaas.core.types import InstanceLoad, LinkStatus, RequestInfo, Role, RouteQuery

KV_BYTES_PER_TOKEN = 50_000.0  # ~ a hybrid model's full-attention KV per token


@dataclass
class FakeView:
    """Two PD-P, two PrfaaS prefill and two decode instances by default. Prefill time is
    linear in the uncached tokens (`sec_per_token` per cluster + 0.1 s), transfer time is the
    KV bytes over the link capacity."""

    loads: list[InstanceLoad] = field(default_factory=list)
    link_status: LinkStatus = field(default_factory=lambda: LinkStatus(100.0))
    now: float = 0.0
    sec_per_token: Mapping[str, float] = field(
        default_factory=lambda: {"pd": 4e-4, "prfaas": 1e-4})

    def __post_init__(self) -> None:
        if not self.loads:
            self.loads = [
                InstanceLoad("pd-p0", "pd", "prefill"), InstanceLoad("pd-p1", "pd", "prefill"),
                InstanceLoad("prf-0", "prfaas", "prefill"),
                InstanceLoad("prf-1", "prfaas", "prefill"),
                InstanceLoad("pd-d0", "pd", "decode", free_slots=8),
                InstanceLoad("pd-d1", "pd", "decode", free_slots=4),
            ]

    @property
    def now_s(self) -> float:
        return self.now

    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        return [i for i in self.loads
                if (cluster is None or i.cluster == cluster) and (role is None or i.role == role)]

    def link(self) -> LinkStatus:
        return self.link_status

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        cluster = next(i.cluster for i in self.loads if i.instance_id == instance_id)
        return 0.1 + self.sec_per_token[cluster] * (total_tokens - cached_tokens)

    def kv_transfer_s(self, tokens: int) -> float:
        return tokens * KV_BYTES_PER_TOKEN * 8 / (self.link_status.capacity_gbps * 1e9)

    def set_queue(self, instance_id: str, queued_work_s: float) -> None:
        self.loads = [InstanceLoad(i.instance_id, i.cluster, i.role, i.queued_requests,
                                   queued_work_s, i.running, i.free_slots)
                      if i.instance_id == instance_id else i for i in self.loads]


def query(input_tokens: int, cached: Mapping[str, int] | None = None, rid: str = "r0"
          ) -> RouteQuery:
    return RouteQuery(RequestInfo(rid, input_tokens, 64, 0.0), dict(cached or {}))


def without(view: FakeView, *prefixes: str, link: LinkStatus | None = None) -> FakeView:
    """A copy of `view` with the instances whose id starts with any of `prefixes` gone (down),
    and optionally another link status."""
    loads = [i for i in view.loads if not i.instance_id.startswith(prefixes)] if prefixes \
        else list(view.loads)
    return FakeView(loads=loads or [InstanceLoad("none", "none", "prefill")],
                    link_status=link or view.link_status, now=view.now,
                    sec_per_token=view.sec_per_token)
