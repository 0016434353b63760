"""Tiny geometries and pools for the cache tests (bytes chosen to make arithmetic obvious)."""

from __future__ import annotations

from prfaas.cache import HybridPrefixPool, PoolConfig, PoolListener
from prfaas.models.kv import KVGeometry

BS = 4  # tokens per block


def hybrid_geometry(kv_per_token: float = 2.0, state: float = 100.0) -> KVGeometry:
    """Block = 8 bytes, snapshot = 100 bytes at BS=4."""
    return KVGeometry(model="toy-hybrid", kv_bytes_per_token=kv_per_token,
                      linear_state_bytes=state, swa_bytes_per_token=0.0,
                      swa_window_tokens=0, swa_full_bytes=0.0)


def dense_geometry() -> KVGeometry:
    return hybrid_geometry(state=0.0)


def linear_only_geometry() -> KVGeometry:
    return hybrid_geometry(kv_per_token=0.0)


def make_pool(capacity_bytes: int | None = None, policy: str = "every_block", k: int = 1,
              geometry: KVGeometry | None = None, listener: PoolListener | None = None,
              pool_id: str = "p0") -> HybridPrefixPool:
    config = PoolConfig(capacity_bytes=capacity_bytes, block_size_tokens=BS,
                        snapshot_policy=policy, snapshot_every_k=k)  # type: ignore[arg-type]
    return HybridPrefixPool(pool_id, geometry or hybrid_geometry(), config, listener)


def chain(n: int, base: int = 1000) -> list[int]:
    """n distinct block hashes; chains with different bases never share a block."""
    return [base + i for i in range(n)]
