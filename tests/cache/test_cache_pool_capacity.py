"""Byte accounting, transfer buffers and rejected configurations."""

import pytest
from cache_factories import BS, chain, hybrid_geometry, make_pool

from prfaas.cache import CacheLayout, HybridPrefixPool, PoolConfig
from prfaas.core.errors import ConfigError
from prfaas.models.catalog import find_model
from prfaas.models.kv import geometry


def test_sizes_come_from_the_geometry() -> None:
    g = geometry(find_model("Kimi-Linear-48B-A3B"))
    layout = CacheLayout(g, 512)
    assert layout.block_bytes == 8064 * 512
    assert layout.snapshot_bytes(3) == 43417600
    config = PoolConfig(block_size_tokens=512, snapshot_policy="every_k", snapshot_every_k=4)
    # 10 blocks -> snapshots after 4, 8 and 10
    assert layout.request_bytes(10 * 512 + 7, config) == 10 * 8064 * 512 + 3 * 43417600


def test_swa_snapshot_grows_until_the_window_is_full() -> None:
    g = geometry(find_model("MiMo-V2-Flash"))
    layout = CacheLayout(g, 64)
    assert g.swa_window_tokens == 128
    assert layout.snapshot_bytes(1) == 64 * g.swa_bytes_per_token
    assert layout.snapshot_bytes(2) == layout.snapshot_bytes(9) == g.swa_full_bytes


def test_snapshot_policy_cost_is_accounted() -> None:
    blocks = chain(8)
    used = {}
    for policy, k in (("every_block", 1), ("every_k", 4), ("request_end", 1)):
        pool = make_pool(policy=policy, k=k)
        pool.insert(blocks, 8 * BS)
        used[policy] = pool.used_bytes
    assert used == {"every_block": 8 * 8 + 8 * 100, "every_k": 8 * 8 + 2 * 100,
                    "request_end": 8 * 8 + 100}


def test_used_bytes_follow_insert_evict_and_transfers() -> None:
    pool = make_pool(capacity_bytes=1000, policy="request_end")
    pool.insert(chain(3), 3 * BS)
    assert pool.used_bytes == 3 * 8 + 100
    assert pool.allocate_transfer("r1", 10)  # 10 tokens * 2 B + 100 B state
    assert pool.used_bytes == 3 * 8 + 100 + 120
    assert pool.free_transfer("r1") == 120
    assert pool.used_bytes == 3 * 8 + 100
    assert pool.used_bytes <= (pool.capacity_bytes or 0)


def test_transfer_evicts_prefix_cache_but_is_never_evicted() -> None:
    pool = make_pool(capacity_bytes=300, policy="request_end")
    pool.insert(chain(3), 3 * BS)  # 124 B
    assert pool.allocate_transfer("r1", 50)  # 200 B: evicts the cached chain
    assert pool.match(chain(3)) == 0
    assert not pool.allocate_transfer("r2", 10)  # 120 B; only 100 free and nothing evictable
    assert pool.stats.transfer_rejects == 1
    assert pool.insert(chain(1, 77), BS) == 0  # 108 B does not fit beside the transfer
    pool.free_transfer("r1")
    assert pool.allocate_transfer("r2", 10)


def test_transfer_ids_are_checked() -> None:
    pool = make_pool()
    assert pool.allocate_transfer("r1", 4)
    with pytest.raises(ConfigError, match="request_id='r1'"):
        pool.allocate_transfer("r1", 4)
    with pytest.raises(ConfigError, match="request_id='nope'"):
        pool.free_transfer("nope")


def test_capacity_smaller_than_one_request_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="capacity_bytes=150") as info:
        make_pool(capacity_bytes=150).insert(chain(4), 4 * BS)  # needs 4*8 + 4*100
    assert "432 bytes" in str(info.value)
    with pytest.raises(ConfigError, match="capacity_bytes=50"):
        make_pool(capacity_bytes=50).allocate_transfer("r", 4)  # needs 108
    config = PoolConfig(capacity_bytes=1000, block_size_tokens=BS, max_request_tokens=400)
    with pytest.raises(ConfigError, match="capacity_bytes=1000"):
        HybridPrefixPool("p", hybrid_geometry(), config)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("capacity_bytes", {"capacity_bytes": -1}),
    ("block_size_tokens", {"block_size_tokens": 0}),
    ("snapshot_every_k", {"snapshot_every_k": 0}),
    ("snapshot_policy", {"snapshot_policy": "sometimes"}),
    ("max_request_tokens", {"max_request_tokens": -5}),
])
def test_bad_pool_config_is_rejected(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=field):
        PoolConfig(**kwargs)  # type: ignore[arg-type]


def test_negative_sizes_and_bad_hashes_are_rejected() -> None:
    pool = make_pool()
    with pytest.raises(ConfigError, match="num_tokens=-1"):
        pool.insert(chain(1), -1)
    with pytest.raises(ConfigError, match="block_hashes=-3"):
        pool.insert([-3], BS)
    with pytest.raises(ConfigError, match="num_tokens=-4"):
        pool.allocate_transfer("r", -4)
    with pytest.raises(ConfigError, match="geometry"):
        make_pool(geometry=hybrid_geometry(kv_per_token=0.0, state=0.0))
