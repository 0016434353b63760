"""Prefix caching for hybrid-attention models: chained block hashes, the per-pool hybrid
prefix cache (full-attention blocks + linear/SWA state snapshots + transfer buffers in one byte
budget) and the global manager that answers "how much of this request is cached where".
Policy core: no torch, no sockets, no clocks."""

from prfaas.cache.config import SNAPSHOT_POLICIES, PoolConfig, SnapshotPolicy, snapshot_boundaries
from prfaas.cache.hashing import chain_hashes, trace_block_hashes
from prfaas.cache.layout import CacheLayout
from prfaas.cache.listener import PoolListener
from prfaas.cache.manager import GlobalKVCacheManager, PrefixMatch
from prfaas.cache.pool import HybridPrefixPool, PinError, PoolStats

__all__ = [
    "SNAPSHOT_POLICIES",
    "CacheLayout",
    "GlobalKVCacheManager",
    "HybridPrefixPool",
    "PinError",
    "PoolConfig",
    "PoolListener",
    "PoolStats",
    "PrefixMatch",
    "SnapshotPolicy",
    "chain_hashes",
    "snapshot_boundaries",
    "trace_block_hashes",
]
