"""Prefix caches in the simulator: hybrid prefix pools + the global manager behind the router.

`SimPrefixCache` holds one `HybridPrefixPool` per scope unit and a `GlobalKVCacheManager`:
- `global`: one pool shared by every prefill instance of every cluster (the upper bound);
- `cluster`: one pool per cluster, shared by its prefill instances (the paper's design);
- `instance`: one pool per prefill instance.
A request's full 512-token blocks (the trace's `hash_ids`, cut to input // 512) are committed
into the pool of the instance that prefilled it when its prefill ends ("a block counts once its
prefill has produced it"); with `cluster` scope a PrfaaS prefill's KV also lands in the PD
cluster's pool (its decode node holds it). Blocks of a request still being prefilled are not
hits: that is the whole gap between `prefix_hit_fraction` and `ideal_prefix_hit_fraction`
under a global unlimited cache.

`CachedSimulator` is the `Simulator` with that cache: the router sees per-instance cached
lengths, a prefill is charged only for its uncached tokens, a PrfaaS prefill ships only the KV
the PD cluster lacks (`KVSize.tail_bytes` past the PD cluster's cached prefix), and a
cross-cluster prefix move (`RouteDecision.prefix_source`) is a flow of its KV bytes on the
shared inter-cluster link that the prefill waits for (both directions share the one simulated
link: conservative). Intra-cluster moves take bytes / intra_gbps before the prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from prfaas.cache import GlobalKVCacheManager, HybridPrefixPool, PoolConfig
from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, PRFAAS_CLUSTER, RequestInfo, RouteQuery
from prfaas.models.kv import KVGeometry
from prfaas.models.profile import KVSize
from prfaas.policy.base import Router
from prfaas.sim.instances import PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.simulator import ARRIVAL, KV_ARRIVE, Simulator
from prfaas.sim.system import SystemConfig
from prfaas.workload.requests import Workload

CacheScope = Literal["global", "cluster", "instance"]
CACHE_SCOPES: tuple[str, ...] = get_args(CacheScope)
BLOCK_TOKENS = 512  # Mooncake traces' hash_ids granularity


def kv_geometry(kv: KVSize) -> KVGeometry:
    """The model geometry behind a KV profile; a fitted profile becomes per-token KV (blocks)
    plus a fixed state (snapshots)."""
    if kv.geometry is not None:
        return kv.geometry
    return KVGeometry(model="fitted-kv", kv_bytes_per_token=kv.per_token_bytes,
                      linear_state_bytes=kv.fixed_bytes, swa_bytes_per_token=0.0,
                      swa_window_tokens=0, swa_full_bytes=0.0)


def full_blocks(hashes: Sequence[int], input_tokens: int) -> Sequence[int]:
    return hashes[:input_tokens // BLOCK_TOKENS]


def ideal_prefix_hit_fraction(workload: Workload) -> float:
    """Cached input tokens / all input tokens with no timing and unlimited capacity: every
    full block of any earlier-arriving request counts (a property of the trace)."""
    if workload.hash_ids is None or not len(workload):
        return 0.0
    seen: set[int] = set()
    hit = 0
    for hashes, tokens in zip(workload.hash_ids, workload.input_tokens.tolist(), strict=True):
        blocks = full_blocks(hashes, tokens)
        for h in blocks:
            if h not in seen:
                break
            hit += BLOCK_TOKENS
        seen.update(blocks)
    return hit / float(workload.input_tokens.sum())


class SimPrefixCache:
    def __init__(self, kv: KVSize, scope: str, capacity_bytes: int | None,
                 instances: Sequence[tuple[str, str]], snapshot_policy: str = "every_block",
                 max_request_tokens: int | None = None) -> None:
        if scope not in CACHE_SCOPES:
            raise ConfigError("cache_scope", scope, f"must be one of {', '.join(CACHE_SCOPES)}")
        self.scope = scope
        config = PoolConfig(capacity_bytes=capacity_bytes, block_size_tokens=BLOCK_TOKENS,
                            snapshot_policy=snapshot_policy,  # type: ignore[arg-type]
                            max_request_tokens=max_request_tokens)
        geo = kv_geometry(kv)
        probe = HybridPrefixPool("probe", geo, config)  # validates capacity vs one request
        self.manager = GlobalKVCacheManager.for_layout(probe.layout)
        self.pools: dict[str, HybridPrefixPool] = {}
        self._pool_of: dict[str, str] = {}
        for instance_id, cluster in instances:
            pool_id = {"global": "global", "cluster": f"pool-{cluster}",
                       "instance": instance_id}[scope]
            if pool_id not in self.pools:
                self.pools[pool_id] = HybridPrefixPool(pool_id, geo, config, self.manager)
            self.manager.add_instance(instance_id, cluster, pool_id)
            self._pool_of[instance_id] = pool_id
        self._pd_pool = f"pool-{PD_CLUSTER}" if scope == "cluster" else None

    def lookup(self, blocks: Sequence[int]) -> dict[str, int]:
        """Cached tokens per instance (instances with a hit only)."""
        if not blocks:
            return {}
        match = self.manager.match(blocks)
        return {i: b * BLOCK_TOKENS for i, b in match.per_instance.items() if b}

    def commit(self, instance_id: str, blocks: Sequence[int], input_tokens: int, now_s: float,
               remote: bool) -> None:
        if not blocks:
            return
        pools = {self._pool_of[instance_id]}
        if remote and self._pd_pool in self.pools:
            pools.add(self._pd_pool)
        for pool_id in pools:
            self.pools[pool_id].insert(blocks, input_tokens, now_s)

    def memory_bytes(self) -> int:
        return sum(p.used_bytes for p in self.pools.values())


class CachedSimulator(Simulator):
    """`Simulator` with prefix caches and prefix moves (see module docstring)."""

    def __init__(self, cfg: SystemConfig, workload: Workload, router: Router | None,
                 cache: SimPrefixCache | None, candidate_limit: int | None = None) -> None:
        super().__init__(cfg, workload, router, candidate_limit=candidate_limit)
        self.cache = cache
        n = len(workload)
        hashes = workload.hash_ids
        self._blocks: list[Sequence[int]] = [
            full_blocks(hashes[i], int(workload.input_tokens[i])) if hashes else ()
            for i in range(n)]
        self._held: dict[int, tuple[PrefillInstance, float]] = {}
        self.hit_tokens = 0
        self.accepted_tokens = 0
        self.prefix_moves = 0
        self.prefix_move_bytes = 0.0

    def _lookup(self, i: int) -> dict[str, int]:
        return self.cache.lookup(self._blocks[i]) if self.cache is not None else {}

    def _on_arrival(self, i: int, _: int) -> None:
        log, now = self.log, self.now_s
        if i + 1 < len(log.arrival_s):
            self._push(log.arrival_s[i + 1], ARRIVAL, i + 1)
        self.in_system_at_arrival.append(self.in_system)
        cached = self._lookup(i)
        info = RequestInfo(str(i), log.input_tokens[i], log.output_tokens[i], now)
        decision = self.router.route(RouteQuery(info, cached), self.view)
        t = self.router.threshold_tokens()
        log.threshold_tokens[i] = -1 if t is None else t
        decoder = self.decode_by_id.get(decision.decode_instance or "")
        prefill = self.prefill_by_id.get(decision.prefill_instance)
        if decision.rejected or decoder is None or prefill is None:
            log.rejected[i] = True
            return
        self.in_system += 1
        decoder.inflight += 1
        self._decoder_of[i] = decoder
        self._prefill_of[i] = prefill
        remote = prefill.cluster == PRFAAS_CLUSTER
        log.remote[i] = remote
        total = log.input_tokens[i]
        self.hit_tokens += decision.cached_tokens
        self.accepted_tokens += total
        pd_prefix = max((c for inst, c in cached.items()
                         if self.prefill_by_id[inst].cluster == PD_CLUSTER), default=0)
        log.kv_bytes[i] = self.cfg.kv.tail_bytes(total, min(pd_prefix, total - 1)) if remote \
            else self.cfg.kv.bytes_for(total)
        service_s = prefill.profile.seconds(total, decision.cached_tokens)
        self._place(i, prefill, service_s, decision.prefix_source,
                    decision.prefix_transfer_tokens)

    def _place(self, i: int, prefill: PrefillInstance, service_s: float, source: str | None,
               tokens: int) -> None:
        src = self.prefill_by_id.get(source or "")
        if src is not None and tokens > 0:
            move_bytes = self.cfg.kv.per_token_bytes * tokens
            self.prefix_moves += 1
            self.prefix_move_bytes += move_bytes
            if src.cluster != prefill.cluster:
                self._held[i] = (prefill, service_s)
                self.link.start(self.now_s, len(self.log.arrival_s) + i, move_bytes)
                self._schedule_link()
                return
            service_s += move_bytes / (self.cfg.intra_gbps * BYTES_PER_GBPS)
        self._enqueue(i, prefill, service_s)

    def _enqueue(self, i: int, prefill: PrefillInstance, service_s: float) -> None:
        prefill.enqueue(i, service_s)
        if prefill.running < 0:
            self._start_prefill(prefill)

    def _on_prefill_done(self, index: int, _: int) -> None:
        prefill = self.prefills[index]
        req = prefill.running
        super()._on_prefill_done(index, _)
        if self.cache is not None:
            self.cache.commit(prefill.instance_id, self._blocks[req], self.log.input_tokens[req],
                              self.now_s, prefill.cluster == PRFAAS_CLUSTER)

    def _on_link_done(self, _: int, version: int) -> None:
        if version != self.link.version:
            return
        now, n = self.now_s, len(self.log.arrival_s)
        for flow in self.link.pop_finished(now):
            if flow >= n:  # a prefix move: the prefill it waited for may start
                prefill, service_s = self._held.pop(flow - n)
                self._enqueue(flow - n, prefill, service_s)
                continue
            self._flow_done[flow] = True
            end = self.log.prefill_end_s[flow]
            if end == end:
                tail = self._last_layer_s(flow, self.link.flow_rate_bps()) \
                    if self.cfg.pipelined else 0.0
                self._push(max(now, end + tail), KV_ARRIVE, flow)
        self._schedule_link()


def cache_metrics(sim: CachedSimulator, workload: Workload) -> dict[str, Any]:
    """The JSON keys this module adds to a run's summary."""
    thresholds = [t for t in sim.log.threshold_tokens if t >= 0]
    simulated = sim.hit_tokens / sim.accepted_tokens if sim.accepted_tokens else 0.0
    return {
        "prefix_hit_fraction": round(simulated, 6),
        "ideal_prefix_hit_fraction": round(ideal_prefix_hit_fraction(workload), 6),
        "prefix_moves": sim.prefix_moves,
        "prefix_move_gb": round(sim.prefix_move_bytes / 1e9, 6),
        "cache_scope": sim.cache.scope if sim.cache else None,
        "cache_used_gb": round(sim.cache.memory_bytes() / 1e9, 3) if sim.cache else 0.0,
        "threshold_tokens": {
            "mean": round(sum(thresholds) / len(thresholds), 1) if thresholds else None,
            "min": min(thresholds) if thresholds else None,
            "max": max(thresholds) if thresholds else None},
    }


__all__ = ["CACHE_SCOPES", "CachedSimulator", "SimPrefixCache", "cache_metrics",
           "ideal_prefix_hit_fraction", "kv_geometry"]
