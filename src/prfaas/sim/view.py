"""`SimView`: the simulator's `ClusterView`, what a router sees of simulated instances.

`instances(cluster, role)` is that pool's `RankedPool` (sim/pools.py): a sequence of the
members' loads for a policy that scans it, and a ranking the shipped policies read instead
(core/pool.py), so a routing decision costs O(k log n), not O(n), and decides exactly as a
scan. The simulator keeps the ranking current: `touch_prefill` / `touch_decode` after every
change of an instance's queue or batch. `instances()` without a cluster or role is a list.

With `candidate_limit=k` (an approximation kept for comparison), a pool larger than k is shown
as its k least-loaded members (by predicted drain time, then id; decode: most free slots,
fewest queued, then id), read from a `LoadIndex` keyed by `order_key()`.

Pools change when the rebalancer moves an instance: `remove` hides it from routing (it drains),
`add` shows its new-role incarnation; a scheduled outage removes and re-adds instances the same
way (sim/failover.py) and shows a down link as `LinkStatus.up = False`. `unlimited()` is a view
of the same pools without the limit (the rebalancer looks at whole pools).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prfaas.core.types import InstanceLoad, LinkStatus, Role
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.load_index import LoadIndex
from prfaas.sim.pools import DecodePool, PrefillPool

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator


class SimView:
    def __init__(self, sim: Simulator, candidate_limit: int | None = None,
                 shared: SimView | None = None) -> None:
        self._sim = sim
        self._limit = candidate_limit
        self._prefill: dict[str, PrefillPool] = shared._prefill if shared else {}
        self._decode: dict[str, DecodePool] = shared._decode if shared else {}
        self._index: dict[tuple[str, Role], LoadIndex] = shared._index if shared else {}
        self._link_key: tuple[int, bool] | None = None
        self._link_status = LinkStatus(0.0)
        if shared is not None:
            return
        for p in sim.prefills:
            self.add(p)
        for d in sim.decoders:
            self.add(d)

    def unlimited(self) -> SimView:
        return SimView(self._sim, None, shared=self)

    def _clock(self) -> float:
        return self._sim.now_s

    @property
    def now_s(self) -> float:
        return self._sim.now_s

    # -- pool membership and the load index --------------------------------------------------
    def add(self, inst: PrefillInstance | DecodeInstance) -> None:
        if isinstance(inst, PrefillInstance):
            pool = self._prefill.get(inst.cluster)
            if pool is None:
                pool = self._prefill[inst.cluster] = PrefillPool(self._clock)
            pool.add(inst)
            role: Role = "prefill"
        else:
            dpool = self._decode.get(inst.cluster)
            if dpool is None:
                dpool = self._decode[inst.cluster] = DecodePool(self._clock)
            dpool.add(inst)
            role = "decode"
        if self._limit is not None:
            self._index.setdefault((inst.cluster, role), LoadIndex()).set(
                inst.instance_id, inst.order_key())

    def remove(self, inst: PrefillInstance | DecodeInstance) -> None:
        if isinstance(inst, PrefillInstance):
            self._prefill[inst.cluster].remove(inst)
            role: Role = "prefill"
        else:
            self._decode[inst.cluster].remove(inst)
            role = "decode"
        index = self._index.get((inst.cluster, role))
        if index is not None:
            index.remove(inst.instance_id)

    def touch_prefill(self, p: PrefillInstance) -> None:
        pool = p.pool  # (set while it is a member of one of these pools)
        if pool is None:
            return
        pool.touch(p)
        if self._index:
            index = self._index.get((p.cluster, "prefill"))
            if index is not None:
                index.set(p.instance_id, p.order_key())

    def touch_decode(self, d: DecodeInstance) -> None:
        pool = d.pool
        if pool is None:
            return
        pool.touch(d)
        if self._index:
            index = self._index.get((d.cluster, "decode"))
            if index is not None:
                index.set(d.instance_id, d.order_key())

    # -- ClusterView -------------------------------------------------------------------------
    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        limit = self._limit
        if cluster is not None and role is not None and limit is None:
            pools = self._prefill if role == "prefill" else self._decode
            pool = pools.get(cluster)
            return pool if pool is not None else []
        now = self._sim.now_s
        out: list[InstanceLoad] = []
        if role in (None, "prefill"):
            for c, pool in self._prefill.items():
                if cluster in (None, c):
                    members: Sequence[PrefillInstance] = pool.members
                    if limit is not None and len(members) > limit:
                        by_id = self._sim.prefill_by_id
                        members = [by_id[i] for i in
                                   self._index[(c, "prefill")].smallest(limit)]
                    out.extend(p.load(now) for p in members)
        if role in (None, "decode"):
            for c, dpool in self._decode.items():
                if cluster in (None, c):
                    dmembers: Sequence[DecodeInstance] = dpool.members
                    if limit is not None and len(dmembers) > limit:
                        by_did = self._sim.decode_by_id
                        dmembers = [by_did[i] for i in
                                    self._index[(c, "decode")].smallest(limit)]
                    out.extend(d.load(now) for d in dmembers)
        return out

    def link(self) -> LinkStatus:
        link = self._sim.link
        key = self._link_key
        if key is not None and key[0] == link.version and key[1] == self._sim.link_down:
            return self._link_status  # nothing joined, left or changed capacity since
        key = (link.version, self._sim.link_down)
        egress = link.egress_bps() / BYTES_PER_GBPS
        self._link_status = LinkStatus(link.capacity_gbps(), egress, up=not self._sim.link_down)
        self._link_key = key
        return self._link_status

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        return self._sim.prefill_by_id[instance_id].profile.seconds(total_tokens, cached_tokens)

    def kv_transfer_s(self, tokens: int) -> float:
        link = self._sim.link
        rate = min(link.flow_cap_bps, link.capacity_gbps() * BYTES_PER_GBPS)
        return self._sim.cfg.kv.bytes_for(tokens) / rate + self._sim.cfg.rtt_s
