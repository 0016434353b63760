"""Mooncake-style baselines (FAST'25 conductor), choosing among every prefill instance of every
cluster with no length threshold. The cost of an instance is Mooncake's TTFT estimate:
    T_queue (queued_work_s) + T_prefill(input, prefix it holds) [+ T_move(prefix fetched)]
    [+ the KV's trip over the inter-cluster link when the instance is in the PrfaaS cluster].

- `load-balance`: least queued work, cache-blind (the chosen node still reuses whatever it
  happens to hold: an engine never recomputes what it has);
- `local-cache-aware`: each instance counts only its own cache; min estimated TTFT;
- `global-cache-aware`: an instance may fetch the longest prefix held anywhere, but only when
  best_len / local_len > `balance_ratio` (Mooncake's balancing threshold, default 1.5; a node
  holding nothing always may); moving it costs `view.kv_transfer_s` when it crosses clusters
  and nothing inside a cluster (RDMA at hundreds of Gbps: small beside a prefill).
Ties go to the longer cache, then the name. Decode: `pick_decode`.

Down parts (policy/base.py): the candidates are the instances up; while the link is down the
PrfaaS instances are left out (and so is fetching a prefix across it); none left, or no decode
instance: `no_path`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prfaas.core.errors import ConfigError
from prfaas.core.types import (
    PRFAAS_CLUSTER,
    ClusterView,
    InstanceLoad,
    Route,
    RouteDecision,
    RouteQuery,
    link_usable,
)
from prfaas.policy.base import (
    NO_DECODE,
    Router,
    no_prefill_reason,
    pick_decode,
    register,
)

Choice = tuple[float, int, str, InstanceLoad, int, str | None, int]


def _usable(cached: int, input_tokens: int) -> int:
    return max(min(cached, input_tokens - 1), 0)


def _decision(choice: Choice, query: RouteQuery, view: ClusterView) -> RouteDecision:
    _, _, _, inst, cached, src, moved = choice
    decoder = pick_decode(view)
    if decoder is None:
        return RouteDecision.no_path(NO_DECODE)
    return RouteDecision(
        route=Route.PRFAAS if inst.cluster == PRFAAS_CLUSTER else Route.PD,
        prefill_instance=inst.instance_id,
        decode_instance=decoder.instance_id,
        cached_tokens=cached, uncached_tokens=query.request.input_tokens - cached,
        prefix_source=src, prefix_transfer_tokens=moved)


class _Conductor(Router):
    """Shared search: subclasses say which prefix an instance would use and at what cost."""

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        candidates = view.instances(None, "prefill")
        if candidates and not link_usable(view.link()):
            candidates = [i for i in candidates if i.cluster != PRFAAS_CLUSTER]
        if not candidates:
            return RouteDecision.no_path(no_prefill_reason(view))
        return _decision(min(self._option(query, view, i, candidates) for i in candidates),
                         query, view)

    def _option(self, query: RouteQuery, view: ClusterView, inst: InstanceLoad,
                all_prefill: Sequence[InstanceLoad]) -> Choice:
        total = query.request.input_tokens
        own = _usable(query.cached_tokens.get(inst.instance_id, 0), total)
        cost = inst.queued_work_s + self._prefill_s(view, inst, total, own)
        if inst.cluster == PRFAAS_CLUSTER:
            cost += view.kv_transfer_s(total - own)
        return (cost, -own, inst.instance_id, inst, own, None, 0)

    def _prefill_s(self, view: ClusterView, inst: InstanceLoad, total: int, cached: int
                   ) -> float:
        return view.prefill_time_s(inst.instance_id, total, cached)


@register("load-balance")
class LoadBalanceRouter(_Conductor):
    name = "load-balance"

    def __init__(self, **_: object) -> None:
        pass

    def _option(self, query: RouteQuery, view: ClusterView, inst: InstanceLoad,
                all_prefill: Sequence[InstanceLoad]) -> Choice:
        own = _usable(query.cached_tokens.get(inst.instance_id, 0), query.request.input_tokens)
        return (inst.queued_work_s, inst.queued_requests, inst.instance_id, inst, own, None, 0)


@register("local-cache-aware")
class LocalCacheAwareRouter(_Conductor):
    name = "local-cache-aware"

    def __init__(self, **_: object) -> None:
        pass


@register("global-cache-aware")
class GlobalCacheAwareRouter(_Conductor):
    name = "global-cache-aware"

    def __init__(self, balance_ratio: float = 1.5, **_: object) -> None:
        if not balance_ratio >= 1:
            raise ConfigError("balance_ratio", balance_ratio, "must be >= 1")
        self.balance_ratio = balance_ratio

    def _option(self, query: RouteQuery, view: ClusterView, inst: InstanceLoad,
                all_prefill: Sequence[InstanceLoad]) -> Choice:
        local = super()._option(query, view, inst, all_prefill)
        total = query.request.input_tokens
        own = local[4]
        src = max(all_prefill, key=lambda i: (query.cached_tokens.get(i.instance_id, 0),
                                              i.instance_id == inst.instance_id))
        best = _usable(query.cached_tokens.get(src.instance_id, 0), total)
        if best <= own or (own > 0 and best / own <= self.balance_ratio):
            return local
        move_s = view.kv_transfer_s(best - own) if src.cluster != inst.cluster else 0.0
        cost = move_s + inst.queued_work_s + self._prefill_s(view, inst, total, best)
        if inst.cluster == PRFAAS_CLUSTER:
            cost += view.kv_transfer_s(total - best)
        fetched: Choice = (cost, -best, inst.instance_id, inst, best, src.instance_id, best - own)
        return min(local, fetched, key=lambda c: c[:3])
