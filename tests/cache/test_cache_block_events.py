"""EngineBlockIndex: an engine's block events (its own hashes + token ids) -> the manager's
chained hashes, evictions included. The expected hashes come from `chain_hashes` over the whole
prompt (what the router computes when it routes), the engine hashes are arbitrary ids: a match
proves the translation through parent hash + token ids, not a shared computation."""

from __future__ import annotations

import random

import pytest

from prfaas.cache import GlobalKVCacheManager, chain_hashes
from prfaas.cache.block_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockIndex,
)
from prfaas.core.errors import ConfigError

BS = 4


def _setup() -> tuple[GlobalKVCacheManager, EngineBlockIndex]:
    manager = GlobalKVCacheManager(BS)
    manager.add_instance("p0", "prfaas")
    manager.add_instance("d0", "pd")
    return manager, EngineBlockIndex("p0", manager, BS)


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def _cached(manager: GlobalKVCacheManager, prompt: list[int]) -> int:
    return manager.match(chain_hashes(prompt, BS), exact=True).cached_tokens("p0")


def test_stored_in_two_events_chained_by_parent_is_matched_then_evicted() -> None:
    manager, index = _setup()
    prompt = _prompt(21)  # 5 full blocks
    # vLLM stores chunk by chunk: blocks 0-1, then 2-4 with block 1's engine hash as parent
    index.apply(BlockStored((101, 102), None, tuple(prompt[:8]), BS))
    index.apply(BlockStored((103, 104, 105), 102, tuple(prompt[8:20]), BS))
    assert _cached(manager, prompt) == 20
    assert manager.match(chain_hashes(prompt, BS)).cached_tokens("d0") == 0
    # the tail block evicted: the hit shrinks by one block
    index.apply(BlockRemoved((105,)))
    assert _cached(manager, prompt) == 16
    # a middle block evicted: nothing past it is usable (exact search)
    index.apply(BlockRemoved((102,)))
    assert _cached(manager, prompt) == 4
    assert index.stats.stored_blocks == 5 and index.stats.removed_blocks == 2


def test_all_blocks_cleared_and_reset_drop_everything() -> None:
    manager, index = _setup()
    prompt = _prompt(16, seed=1)
    index.apply(BlockStored((1, 2, 3, 4), None, tuple(prompt), BS))
    assert _cached(manager, prompt) == 16
    index.apply(AllBlocksCleared())
    assert _cached(manager, prompt) == 0 and manager.num_indexed_blocks == 0
    index.apply(BlockStored((1, 2, 3, 4), None, tuple(prompt), BS))
    index.reset()
    assert _cached(manager, prompt) == 0 and index.stats.resets == 1


def test_negative_controls_wrong_tokens_unknown_parent_other_block_size_count_nothing() -> None:
    manager, index = _setup()
    prompt = _prompt(16, seed=2)
    other = list(prompt)
    other[5] += 1  # one token differs in block 1
    index.apply(BlockStored((1, 2, 3, 4), None, tuple(other), BS))
    assert _cached(manager, prompt) == 4  # only block 0 is the same prefix
    manager2, index2 = _setup()
    # the parent's event was missed: the chain cannot be placed, nothing is counted
    index2.apply(BlockStored((7, 8), 6, tuple(prompt[8:16]), BS))
    assert _cached(manager2, prompt) == 0 and index2.stats.unplaced_blocks == 2
    index2.apply(BlockStored((1, 2), None, tuple(prompt[:16]), 8))  # another block size
    assert _cached(manager2, prompt) == 0 and index2.stats.unplaced_blocks == 4
    index2.apply(BlockRemoved((99,)))
    assert index2.stats.unknown_removed == 1


def test_a_block_stored_twice_is_held_until_both_copies_are_removed() -> None:
    """vLLM does not de-duplicate: a block computed again while its hash is cached (a hybrid
    prompt whose attention blocks hit but whose state did not) is a second block with its own
    BlockStored and, later, its own BlockRemoved (a prefix-cache hit stores nothing:
    single_type_kv_cache_manager marks hit blocks cached)."""
    manager, index = _setup()
    prompt = _prompt(12, seed=3)
    for _ in range(2):
        index.apply(BlockStored((1, 2, 3), None, tuple(prompt), BS))
    assert _cached(manager, prompt) == 12
    index.apply(BlockRemoved((3,)))  # one copy evicted: the other still serves a hit
    assert _cached(manager, prompt) == 12
    index.apply(BlockRemoved((3,)))
    assert _cached(manager, prompt) == 8
    index.apply(BlockRemoved((3,)))  # no copy left
    assert index.stats.unknown_removed == 1


def test_hybrid_state_groups_are_snapshots() -> None:
    manager, index = _setup()
    prompt = _prompt(8, seed=4)
    # attention group 0 holds both blocks; the GDN state group 1 only the state after block 1
    index.apply(BlockStored((1, 2), None, tuple(prompt), BS, group=0, kind="full_attention"))
    index.apply(BlockStored((2,), 1, tuple(prompt[4:8]), BS, group=1, kind="mamba"))
    assert _cached(manager, prompt) == 8
    index.apply(BlockRemoved((2,), group=1))  # the state is gone, the KV blocks are not
    assert _cached(manager, prompt) == 0
    assert manager.num_indexed_blocks == 2


def test_bad_block_size() -> None:
    with pytest.raises(ConfigError, match="block_size_tokens"):
        EngineBlockIndex("p0", GlobalKVCacheManager(BS), 0)
