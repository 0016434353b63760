"""`SimView`: the simulator's `ClusterView`, what a router sees of simulated instances.

With `candidate_limit=k`, a pool of prefill instances is shown as its k least-loaded members
(by predicted drain time, then id) and the decode pool as its k best (most free slots, fewest
queued, then id). For a pool of one hardware type and no prefix caches this changes no decision
of the built-in routers (they take the minimum of exactly those keys); it makes routing cost
O(k) instead of O(instances) for scale runs. None (the default) shows every instance.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prfaas.core.types import InstanceLoad, LinkStatus, Role
from prfaas.sim.link import BYTES_PER_GBPS

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator


class SimView:
    def __init__(self, sim: Simulator, candidate_limit: int | None = None) -> None:
        self._sim = sim
        self._limit = candidate_limit
        self._prefill = {c: [p for p in sim.prefills if p.cluster == c]
                         for c in {p.cluster for p in sim.prefills}}
        self._decode = {c: [d for d in sim.decoders if d.cluster == c]
                        for c in {d.cluster for d in sim.decoders}}

    @property
    def now_s(self) -> float:
        return self._sim.now_s

    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        now = self._sim.now_s
        out: list[InstanceLoad] = []
        if role in (None, "prefill"):
            for c, pool in self._prefill.items():
                if cluster in (None, c):
                    chosen = pool if self._limit is None or len(pool) <= self._limit else \
                        heapq.nsmallest(self._limit, pool,
                                        key=lambda p: (p.drain_s(now), p.instance_id))
                    out.extend(p.load(now) for p in chosen)
        if role in (None, "decode"):
            for c, dpool in self._decode.items():
                if cluster in (None, c):
                    dchosen = dpool if self._limit is None or len(dpool) <= self._limit else \
                        heapq.nsmallest(self._limit, dpool, key=lambda d: (
                            -d.free_slots(), d.batch + len(d.waiting) + d.inflight,
                            d.instance_id))
                    out.extend(d.load(now) for d in dchosen)
        return out

    def link(self) -> LinkStatus:
        link = self._sim.link
        egress = link.flow_rate_bps() * link.active / BYTES_PER_GBPS
        return LinkStatus(link.capacity_gbps(), egress)

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        return self._sim.prefill_by_id[instance_id].profile.seconds(total_tokens, cached_tokens)

    def kv_transfer_s(self, tokens: int) -> float:
        link = self._sim.link
        rate = min(link.flow_cap_bps, link.capacity_gbps() * BYTES_PER_GBPS)
        return self._sim.cfg.kv.bytes_for(tokens) / rate
