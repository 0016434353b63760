"""The hybrid hit rule: blocks AND a snapshot at the boundary."""

from cache_factories import BS, chain, dense_geometry, linear_only_geometry, make_pool


def test_hit_falls_back_to_previous_snapshot() -> None:
    pool = make_pool(policy="every_k", k=4)
    blocks = chain(10)
    assert pool.insert(blocks, 10 * BS) == 10  # snapshots after blocks 4, 8 and 10 (the end)
    assert pool.match(blocks[:7]) == 4  # boundary 7 has no snapshot: back to 4
    assert pool.match(blocks[:9]) == 8
    assert pool.match(blocks) == 10
    assert pool.match(blocks[:3]) == 0  # blocks present, no snapshot yet: no hit


def test_full_attention_blocks_alone_never_hit_a_hybrid_model() -> None:
    pool = make_pool(policy="request_end")
    blocks = chain(5)
    pool.insert(blocks, 5 * BS)
    assert all(pool.contains_block(h) for h in blocks)
    assert pool.num_snapshots == 1  # after block 5 only
    for n in range(1, 5):
        assert pool.match(blocks[:n]) == 0, n
    assert pool.match([*blocks, 99, 98]) == 5  # a longer request reuses up to the snapshot


def test_missing_block_cuts_the_hit_even_with_later_snapshots() -> None:
    pool = make_pool(policy="every_block")
    blocks = chain(6)
    pool.insert(blocks, 6 * BS)
    other = [blocks[0], 777, *blocks[2:]]  # diverges at block 1
    assert pool.match(other) == 1


def test_evicting_a_snapshot_shortens_later_hits() -> None:
    # Room for 6 blocks (8 B) + 2 snapshots (100 B) exactly.
    pool = make_pool(capacity_bytes=6 * 8 + 2 * 100, policy="every_k", k=3)
    blocks = chain(6)
    assert pool.insert(blocks, 6 * BS) == 6
    assert pool.used_bytes == 6 * 8 + 2 * 100
    # A new request needs one block + one snapshot; the LRU drops the chain's tail first,
    # which here is the snapshot after block 6, then block 6 itself.
    assert pool.insert(chain(1, base=5000), BS) == 1
    assert not pool.has_snapshot(blocks[5])
    assert pool.has_snapshot(blocks[2])
    assert pool.match(blocks) == 3


def test_trailing_partial_block_is_not_cached() -> None:
    pool = make_pool(policy="request_end")
    blocks = chain(3)
    assert pool.insert(blocks, 3 * BS - 1) == 2  # only two full blocks; snapshot after block 2
    assert not pool.contains_block(blocks[2])
    assert pool.match(blocks) == 2


def test_dense_model_needs_no_snapshot() -> None:
    pool = make_pool(policy="request_end", geometry=dense_geometry())
    blocks = chain(5)
    pool.insert(blocks, 5 * BS)
    assert pool.num_snapshots == 0
    assert pool.match(blocks[:3]) == 3  # any block boundary is a hit
    assert pool.used_bytes == 5 * 8


def test_linear_only_model_needs_only_the_snapshot() -> None:
    pool = make_pool(policy="every_k", k=2, geometry=linear_only_geometry())
    blocks = chain(5)
    pool.insert(blocks, 5 * BS)
    assert pool.num_blocks == 0
    assert pool.used_bytes == 3 * 100  # snapshots after blocks 2, 4, 5
    assert pool.match(blocks[:3]) == 2
    assert pool.match(blocks) == 5


def test_match_counts_hits_and_misses() -> None:
    pool = make_pool()
    blocks = chain(3)
    pool.insert(blocks, 3 * BS)
    pool.match(blocks)
    pool.match(chain(3, base=9))
    assert (pool.stats.queries, pool.stats.hits, pool.stats.misses) == (2, 1, 1)
    assert pool.stats.hit_blocks == 3
