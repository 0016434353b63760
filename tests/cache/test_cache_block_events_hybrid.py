"""EngineBlockIndex on a hybrid engine's batches shaped like vLLM 0.32's for the tiny Qwen3-Next
(benchmarks/results/vllm_hybrid_events.json, one instance, 256-token blocks, 1,024-token steps):
per step, GDN state groups 0-2 (`mamba`) first, then attention group 3; a state event carries
the step's tokens but hashes only for the blocks whose state was kept (align mode); a prompt's
first pass keeps no state; a second pass computes its attention blocks again (second copies
under the same hashes) and keeps the state at block 7 (1,792 tokens). vLLM's own counts, from
the probe: 0 cached on a repeat after the first pass, 1,792 after the second pass, still 1,792
after fillers evicted five attention blocks. The engine hashes here are arbitrary ids; the
router's side is `chain_hashes` over the whole prompt, so a match proves the translation."""

from __future__ import annotations

import random

from prfaas.cache import GlobalKVCacheManager, chain_hashes
from prfaas.cache.block_events import BlockEvent, BlockRemoved, BlockStored, EngineBlockIndex

BS = 256
STEP = 1024  # max_num_batched_tokens
STATE_GROUPS = (0, 1, 2)
ATTN = 3


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def _setup() -> tuple[GlobalKVCacheManager, EngineBlockIndex]:
    manager = GlobalKVCacheManager(BS)
    manager.add_instance("p0", "pd")
    return manager, EngineBlockIndex("p0", manager, BS)


def _cached(manager: GlobalKVCacheManager, prompt: list[int]) -> int:
    return manager.match(chain_hashes(prompt, BS), exact=True).cached_tokens("p0")


def _pass(prompt: list[int], ids: list[int], kept: set[int]) -> list[list[BlockEvent]]:
    """vLLM's batches for one computation of `prompt` (one per step): `ids` its blocks' engine
    hashes, `kept` the blocks whose state the GDN groups keep."""
    full = len(prompt) // BS
    batches: list[list[BlockEvent]] = []
    for start in range(0, full * BS, STEP):
        end = min(start + STEP, full * BS)
        blocks = range(start // BS, end // BS)
        tokens = tuple(prompt[start:end])
        parent = None if start == 0 else ids[start // BS - 1]
        batch: list[BlockEvent] = [
            BlockStored(tuple(ids[b] for b in blocks if b in kept), parent, tokens, BS, g,
                        "mamba") for g in STATE_GROUPS]
        batch.append(BlockStored(tuple(ids[b] for b in blocks), parent, tokens, BS, ATTN,
                                 "full_attention"))
        batches.append(batch)
    return batches


def _feed(index: EngineBlockIndex, batches: list[list[BlockEvent]]) -> None:
    for batch in batches:
        index.apply_batch(batch)


def _old_mapping(batches: list[list[BlockEvent]]) -> list[list[BlockEvent]]:
    """What the index placed before the fix: state events whose hashes do not line up with
    their tokens were refused whole (so the instance looked dense: a block its own state)."""
    return [[e for e in b if not isinstance(e, BlockStored)
             or len(e.token_ids) == len(e.block_hashes) * e.block_size_tokens] for b in batches]


A = _prompt(2000, seed=70)  # 7 full blocks: 1,792 tokens
IDS = [1000 + i for i in range(7)]


def test_hybrid_prefix_counts_what_vllm_reports_cached() -> None:
    manager, index = _setup()
    _feed(index, _pass(A, IDS, kept=set()))
    assert _cached(manager, A) == 0  # vLLM: 0 cached on the immediate repeat (no state kept)
    assert index.num_blocks == 7  # the attention blocks are indexed, they just cannot resume
    _feed(index, _pass(A, IDS, kept={6}))
    assert _cached(manager, A) == 1792  # vLLM: 1,792 after A's second pass
    assert index.stats.unplaced_blocks == 0
    # fillers evict five attention blocks: the first pass's copies (LRU), as in the probe
    for b in range(5):
        index.apply(BlockRemoved((IDS[b],), ATTN))
    assert _cached(manager, A) == 1792  # vLLM: 1,792 after the fillers
    # the second copy of block 2 goes too: blocks 0-1 remain but hold no state: no resume
    index.apply(BlockRemoved((IDS[2],), ATTN))
    assert _cached(manager, A) == 0
    assert index.stats.unknown_removed == 0


def test_losing_the_kept_state_stops_the_count() -> None:
    manager, index = _setup()
    _feed(index, _pass(A, IDS, kept=set()) + _pass(A, IDS, kept={6}))
    assert _cached(manager, A) == 1792
    index.apply(BlockRemoved((IDS[6],), 1))  # one GDN group dropped its state page
    assert _cached(manager, A) == 0
    assert index.num_blocks == 7


def test_a_state_named_first_in_the_same_batch_is_placed_after_the_batch() -> None:
    """A step whose attention blocks are new and whose state is kept: the state groups' events
    come first in the batch and name a hash only the attention event (after them) places."""
    manager, index = _setup()
    batches = _pass(A, IDS, kept={3, 6})
    _feed(index, batches)
    assert _cached(manager, A) == 1792
    assert _cached(manager, A[:1100]) == 1024  # resumes at the state after block 3
    # negative control: the same events one at a time (no look-ahead) leave the states unplaced
    m2, one_by_one = _setup()
    for batch in batches:
        for event in batch:
            one_by_one.apply(event)
    assert _cached(m2, A) == 0
    assert one_by_one.stats.unplaced_blocks == 6  # 2 kept states x 3 groups


def test_negative_control_the_old_mapping_counts_what_vllm_did_not_cache() -> None:
    manager, index = _setup()
    _feed(index, _old_mapping(_pass(A, IDS, kept=set())))
    # no state group learned: the instance looks dense and every attention block its own
    # state; vLLM reported 0 here
    assert _cached(manager, A) == 1792
    fixed_manager, fixed = _setup()
    _feed(fixed, _pass(A, IDS, kept=set()))
    assert _cached(fixed_manager, A) == 0


def test_a_block_size_other_than_the_instances_places_nothing() -> None:
    """vLLM raised the hybrid model's block to 256; a router hashing 128-token blocks (the
    topology's old setting) places none of its events."""
    manager = GlobalKVCacheManager(128)
    manager.add_instance("p0", "pd")
    index = EngineBlockIndex("p0", manager, 128)
    _feed(index, _pass(A, IDS, kept=set()) + _pass(A, IDS, kept={6}))
    assert index.stats.stored_blocks == 0 and index.stats.unplaced_blocks == 17
    assert manager.match(chain_hashes(A, 128), exact=True).cached_tokens("p0") == 0
