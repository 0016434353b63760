"""The global KVCache manager: which pool of which cluster holds which prefix.

Pools report inserts and evictions (it is their `PoolListener`), so the index is always as
current as the pools. Instances are registered with their cluster and the pool they read from:
one pool per instance, or one pool shared by many instances (a cluster-wide "global" pool).
Index: block hash -> bitmask of pools holding the block, and block hash -> bitmask of pools
holding a state snapshot after it (Python ints as bitsets). A lookup applies the same hybrid
rule as `HybridPrefixPool.match` to every pool at once (prefix_search.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prfaas.cache.layout import CacheLayout
from prfaas.cache.prefix_search import closed_hits, exact_hits
from prfaas.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Cached-prefix lengths (in blocks) of one request: every registered instance (0 on a
    miss) and the best of each cluster."""

    block_size_tokens: int
    per_instance: dict[str, int]
    per_cluster: dict[str, int]
    members: Mapping[str, tuple[str, ...]]  # cluster -> its instances, registration order

    def best_instance(self, cluster: str, load: Mapping[str, float] | None = None) -> str | None:
        """The cluster's instance with the longest hit; ties go to the least loaded (by
        `load`, missing = 0), then to the first registered. None for an unknown cluster."""
        candidates = self.members.get(cluster)
        if not candidates:
            return None
        hits = self.per_instance
        top = max(hits[i] for i in candidates)
        tied = [i for i in candidates if hits[i] == top]
        if len(tied) == 1 or load is None:
            return tied[0]
        return min(tied, key=lambda i: load.get(i, 0.0))

    def cached_tokens(self, instance_id: str) -> int:
        return self.per_instance.get(instance_id, 0) * self.block_size_tokens

    def cluster_tokens(self, cluster: str) -> int:
        return self.per_cluster.get(cluster, 0) * self.block_size_tokens


class GlobalKVCacheManager:
    """Implements PoolListener; one per deployment (the router's or the simulator's)."""

    def __init__(self, block_size_tokens: int = 512, needs_blocks: bool = True,
                 needs_snapshots: bool = True) -> None:
        if block_size_tokens <= 0:
            raise ConfigError("block_size_tokens", block_size_tokens, "must be positive")
        if not (needs_blocks or needs_snapshots):
            raise ConfigError("needs_blocks", needs_blocks, "a hit needs blocks or snapshots")
        self.block_size_tokens = block_size_tokens
        self.needs_blocks = needs_blocks
        self.needs_snapshots = needs_snapshots
        self._kv: dict[int, int] = {}  # block hash -> pool bitmask
        self._snap: dict[int, int] = {}  # block hash -> bitmask of pools with a snapshot after it
        self._pool_bit: dict[str, int] = {}
        self._instance_bit: dict[str, int] = {}
        self._members: dict[str, tuple[str, ...]] = {}
        self._cluster_bits: dict[str, tuple[int, ...]] = {}

    @classmethod
    def for_layout(cls, layout: CacheLayout) -> GlobalKVCacheManager:
        return cls(layout.block_size_tokens, layout.needs_blocks, layout.needs_snapshots)

    def add_instance(self, instance_id: str, cluster: str, pool_id: str | None = None) -> None:
        """Register an instance of `cluster` reading pool `pool_id` (default: its own id)."""
        if instance_id in self._instance_bit:
            raise ConfigError("instance_id", instance_id, "already registered")
        pool = instance_id if pool_id is None else pool_id
        bit = self._pool_bit.setdefault(pool, len(self._pool_bit))
        self._instance_bit[instance_id] = bit
        self._members[cluster] = (*self._members.get(cluster, ()), instance_id)
        self._cluster_bits[cluster] = (*self._cluster_bits.get(cluster, ()), bit)

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(self._instance_bit)

    @property
    def num_indexed_blocks(self) -> int:
        return len(self._kv)

    @property
    def num_indexed_snapshots(self) -> int:
        return len(self._snap)

    def _bit(self, pool_id: str) -> int:
        bit = self._pool_bit.get(pool_id)
        if bit is None:
            raise ConfigError("pool_id", pool_id, "not registered; call add_instance first")
        return 1 << bit

    # --- PoolListener -------------------------------------------------------------------------
    def on_insert(self, pool_id: str, block_hashes: Sequence[int],
                  snapshot_hashes: Sequence[int]) -> None:
        bit = self._bit(pool_id)
        for index, hashes in ((self._kv, block_hashes), (self._snap, snapshot_hashes)):
            for h in hashes:
                index[h] = index.get(h, 0) | bit

    def on_evict(self, pool_id: str, block_hashes: Sequence[int],
                 snapshot_hashes: Sequence[int]) -> None:
        keep = ~self._bit(pool_id)
        for index, hashes in ((self._kv, block_hashes), (self._snap, snapshot_hashes)):
            for h in hashes:
                mask = index.get(h, 0) & keep
                if mask:
                    index[h] = mask
                else:
                    index.pop(h, None)

    def forget_pool(self, pool_id: str) -> None:
        """The pool lost everything (its worker restarted): drop it from every entry."""
        keep = ~self._bit(pool_id)
        for index in (self._kv, self._snap):
            for h in [h for h, mask in index.items() if mask & ~keep]:
                mask = index[h] & keep
                if mask:
                    index[h] = mask
                else:
                    del index[h]

    # --- lookup -------------------------------------------------------------------------------
    def match(self, block_hashes: Sequence[int], exact: bool = False) -> PrefixMatch:
        """Cached-prefix lengths of a request, per instance and per cluster. The default search
        relies on the pools' prefix-closure contract (see prefix_search); `exact=True` checks
        every block and suits listeners that do not keep that contract."""
        per_pool = self._per_pool_hits(block_hashes, exact)
        per_instance = {i: per_pool[b] for i, b in self._instance_bit.items()}
        get = per_pool.__getitem__
        per_cluster = {c: max(map(get, bits)) for c, bits in self._cluster_bits.items()}
        return PrefixMatch(self.block_size_tokens, per_instance, per_cluster, self._members)

    def _per_pool_hits(self, block_hashes: Sequence[int], exact: bool) -> list[int]:
        kv = self._kv if self.needs_blocks else None
        snap = self._snap if self.needs_snapshots else None
        if kv is None or exact:
            return exact_hits(kv, snap, block_hashes, len(self._pool_bit))
        return closed_hits(kv, snap, block_hashes, len(self._pool_bit))
