"""LRU eviction, reference counts and pinning."""

import pytest
from cache_factories import BS, chain, dense_geometry, make_pool

from prfaas.cache import PinError


def dense_pool(num_blocks: int):  # type: ignore[no-untyped-def]
    return make_pool(capacity_bytes=num_blocks * 8, geometry=dense_geometry())


def test_least_recently_used_chain_is_evicted_first() -> None:
    pool = dense_pool(4)
    a, b, c = chain(2, 100), chain(2, 200), chain(2, 300)
    pool.insert(a, 2 * BS)
    pool.insert(b, 2 * BS)
    pool.insert(a, 2 * BS)  # re-commit touches a: b is now the oldest
    pool.insert(c, 2 * BS)
    assert pool.match(a) == 2 and pool.match(c) == 2
    assert pool.match(b) == 0
    assert pool.stats.evictions == 2


def test_tail_blocks_go_before_head_blocks() -> None:
    pool = dense_pool(4)
    a = chain(4, 100)
    pool.insert(a, 4 * BS)
    pool.insert(chain(1, 900), BS)
    assert pool.match(a) == 3  # the tail block went, the shared head stays usable


def test_pinned_blocks_are_not_evicted() -> None:
    pool = dense_pool(4)
    a, b = chain(2, 100), chain(4, 200)
    pool.insert(a, 2 * BS)
    assert pool.acquire(a, 2)
    assert pool.insert(b, 4 * BS) == 2  # only room for 2 of b's blocks: a is pinned
    assert pool.match(a) == 2
    pool.release(a, 2)
    assert pool.insert(b, 4 * BS) == 4  # now a can go
    assert pool.match(a) == 0


def test_refcount_needs_every_release() -> None:
    pool = dense_pool(2)
    a = chain(2, 100)
    pool.insert(a, 2 * BS)
    assert pool.acquire(a, 2) and pool.acquire(a, 1)
    pool.release(a, 2)
    pool.insert(chain(2, 500), 2 * BS)  # block a[0] still pinned by the second acquire
    assert pool.contains_block(a[0]) and not pool.contains_block(a[1])
    pool.release(a, 1)
    pool.insert(chain(2, 600), 2 * BS)
    assert not pool.contains_block(a[0])


def test_acquire_of_a_missing_hit_pins_nothing() -> None:
    pool = dense_pool(4)
    a = chain(2, 100)
    pool.insert(a, 2 * BS)
    assert not pool.acquire([*a, 55], 3)
    with pytest.raises(PinError):
        pool.release(a, 1)


def test_unbalanced_release_raises() -> None:
    pool = dense_pool(4)
    a = chain(2, 100)
    pool.insert(a, 2 * BS)
    pool.acquire(a, 1)
    with pytest.raises(PinError, match="not pinned"):
        pool.release(a, 2)
    pool.release(a, 1)  # the failed release changed nothing


def test_hybrid_acquire_pins_the_snapshot_too() -> None:
    pool = make_pool(capacity_bytes=2 * 8 + 100, policy="request_end")
    a = chain(2, 100)
    pool.insert(a, 2 * BS)
    assert pool.acquire(a, 2)
    assert pool.insert(chain(1, 500), BS) == 0  # nothing evictable: the new chain does not fit
    assert pool.match(a) == 2
