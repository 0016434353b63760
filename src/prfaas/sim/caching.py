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

`CachePlugin` plugs that cache into a `Simulator` (sim/plugin.py): the router sees per-instance
cached lengths, a prefill is charged only for its uncached tokens, a PrfaaS prefill ships only the
KV the PD cluster lacks (`KVSize.tail_bytes` past the PD cluster's cached prefix), and a
cross-cluster prefix move (`RouteDecision.prefix_source`) is a flow of its KV bytes on the
shared inter-cluster link that the prefill waits for (both directions share the one simulated
link: conservative). Intra-cluster moves take bytes / intra_gbps before the prefill. A prefill
instance the rebalancer adds mid-run gets its pool (or share) on its first commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from prfaas.cache import GlobalKVCacheManager, HybridPrefixPool, PoolConfig
from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, PRFAAS_CLUSTER, RouteDecision
from prfaas.models.kv import KVGeometry
from prfaas.models.profile import KVSize
from prfaas.sim.instances import PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.plugin import Placement, SimPlugin
from prfaas.sim.simulator import Simulator
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
        self._geo, self._config = geo, config
        self.pools: dict[str, HybridPrefixPool] = {}
        self._pool_of: dict[str, str] = {}
        for instance_id, cluster in instances:
            self.add_instance(instance_id, cluster)
        self._pd_pool = f"pool-{PD_CLUSTER}" if scope == "cluster" else None

    def lookup(self, blocks: Sequence[int]) -> dict[str, int]:
        """Cached tokens per instance (instances with a hit only)."""
        if not blocks:
            return {}
        match = self.manager.match(blocks)
        return {i: b * BLOCK_TOKENS for i, b in match.per_instance.items() if b}

    def add_instance(self, instance_id: str, cluster: str) -> None:
        """Give an instance a pool (`instance` scope) or a share of one (the rebalancer adds
        prefill instances mid-run)."""
        pool_id = {"global": "global", "cluster": f"pool-{cluster}",
                   "instance": instance_id}[self.scope]
        if pool_id not in self.pools:
            self.pools[pool_id] = HybridPrefixPool(pool_id, self._geo, self._config,
                                                   self.manager)
        self.manager.add_instance(instance_id, cluster, pool_id)
        self._pool_of[instance_id] = pool_id

    def commit(self, instance_id: str, cluster: str, blocks: Sequence[int], input_tokens: int,
               now_s: float, remote: bool) -> None:
        if not blocks:
            return
        if instance_id not in self._pool_of:
            self.add_instance(instance_id, cluster)
        pools = {self._pool_of[instance_id]}
        if remote and self._pd_pool in self.pools:
            pools.add(self._pd_pool)
        for pool_id in pools:
            self.pools[pool_id].insert(blocks, input_tokens, now_s)

    def memory_bytes(self) -> int:
        return sum(p.used_bytes for p in self.pools.values())


class CachePlugin(SimPlugin):
    """Prefix caches and prefix moves as a simulator plug-in (see module docstring)."""

    def __init__(self, cache: SimPrefixCache | None, workload: Workload) -> None:
        self.cache = cache
        hashes = workload.hash_ids
        self._blocks: list[Sequence[int]] = [
            full_blocks(hashes[i], int(workload.input_tokens[i])) if hashes else ()
            for i in range(len(workload))]
        self._sim: Simulator | None = None
        self.hit_tokens = 0
        self.accepted_tokens = 0
        self.prefix_moves = 0
        self.prefix_move_bytes = 0.0

    def attach(self, sim: Simulator) -> None:
        self._sim = sim

    def cached_tokens(self, req: int) -> Mapping[str, int]:
        return self.cache.lookup(self._blocks[req]) if self.cache is not None else {}

    def on_routed(self, req: int, decision: RouteDecision, prefill: PrefillInstance,
                  cached: Mapping[str, int]) -> Placement:
        sim = self._sim
        assert sim is not None, "attach() runs before the first event"
        total = sim.log.input_tokens[req]
        self.hit_tokens += decision.cached_tokens
        self.accepted_tokens += total
        kv = sim.cfg.kv
        if prefill.cluster == PRFAAS_CLUSTER:
            pd_prefix = max((c for inst, c in cached.items()
                             if sim.prefill_by_id[inst].cluster == PD_CLUSTER), default=0)
            kv_bytes = kv.tail_bytes(total, min(pd_prefix, total - 1))
        else:
            kv_bytes = kv.bytes_for(total)
        service_s = prefill.profile.seconds(total, decision.cached_tokens)
        src = sim.prefill_by_id.get(decision.prefix_source or "")
        if src is None or decision.prefix_transfer_tokens <= 0:
            return Placement(service_s, kv_bytes)
        move_bytes = kv.per_token_bytes * decision.prefix_transfer_tokens
        self.prefix_moves += 1
        self.prefix_move_bytes += move_bytes
        if src.cluster != prefill.cluster:
            return Placement(service_s, kv_bytes, link_wait_bytes=move_bytes)
        return Placement(service_s + move_bytes / (sim.cfg.intra_gbps * BYTES_PER_GBPS),
                         kv_bytes)

    def on_prefill_done(self, req: int, prefill: PrefillInstance) -> None:
        if self.cache is not None and self._sim is not None:
            self.cache.commit(prefill.instance_id, prefill.cluster, self._blocks[req],
                              self._sim.log.input_tokens[req], self._sim.now_s,
                              prefill.cluster == PRFAAS_CLUSTER)


def cache_metrics(sim: Simulator, plugin: CachePlugin, workload: Workload) -> dict[str, Any]:
    """The JSON keys this module adds to a run's summary."""
    thresholds = [t for t in sim.log.threshold_tokens if t >= 0]
    simulated = plugin.hit_tokens / plugin.accepted_tokens if plugin.accepted_tokens else 0.0
    return {
        "prefix_hit_fraction": round(simulated, 6),
        "ideal_prefix_hit_fraction": round(ideal_prefix_hit_fraction(workload), 6),
        "prefix_moves": plugin.prefix_moves,
        "prefix_move_gb": round(plugin.prefix_move_bytes / 1e9, 6),
        "cache_scope": plugin.cache.scope if plugin.cache else None,
        "cache_used_gb": round(plugin.cache.memory_bytes() / 1e9, 3) if plugin.cache else 0.0,
        "threshold_tokens": {
            "mean": round(sum(thresholds) / len(thresholds), 1) if thresholds else None,
            "min": min(thresholds) if thresholds else None,
            "max": max(thresholds) if thresholds else None},
    }


__all__ = ["CACHE_SCOPES", "CachePlugin", "SimPrefixCache", "cache_metrics",
           "ideal_prefix_hit_fraction", "kv_geometry"]
