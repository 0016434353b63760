"""The router's KV-events subscriber against vLLM's own publisher classes (no vLLM instance):
vLLM's ZmqEventPublisher sends its KVEventBatch structs over a real ZMQ socket, our subscriber
(integrations/vllm/kv_events.py) decodes them and keeps a GlobalKVCacheManager current; a lost
batch (sequence gap) resets the instance's index."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from needs import needs

pytestmark = needs("vllm")

from prfaas.cache import GlobalKVCacheManager, chain_hashes  # noqa: E402
from prfaas.integrations.vllm.kv_events import VllmKvEvents, endpoints, events_config  # noqa: E402
from prfaas.serve.ports import free_port  # noqa: E402

BS = 16


def _stored(hashes: list[int], parent: int | None, tokens: list[int], **kw: object) -> object:
    from vllm.distributed.kv_events import BlockStored

    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=BS, lora_id=None, medium="GPU", lora_name=None,
                       group_idx=0, kv_cache_spec_kind="full_attention", **kw)


def _batch(*events: object) -> object:
    from vllm.distributed.kv_events import KVEventBatch

    return KVEventBatch(ts=time.time(), events=list(events))


def _manager() -> GlobalKVCacheManager:
    m = GlobalKVCacheManager(BS)
    m.add_instance("prfaas-0", "prfaas")
    return m


def _cached(m: GlobalKVCacheManager, prompt: list[int]) -> int:
    return m.match(chain_hashes(prompt, BS), exact=True).cached_tokens("prfaas-0")


def test_vllm_publisher_to_manager_over_zmq() -> None:
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, ZmqEventPublisher

    prompt = [random.Random(0).randrange(3, 1000) for _ in range(5 * BS + 3)]
    port = free_port()
    conf = events_config(endpoints("prfaas-0", "127.0.0.1", port, None, False)[0], "prfaas-0")
    pub = ZmqEventPublisher(0, endpoint=conf["endpoint"], topic=conf["topic"])
    manager = _manager()
    sub = VllmKvEvents({"prfaas-0": f"tcp://127.0.0.1:{port}"}, manager, BS)
    index = sub.indexes["prfaas-0"]

    async def until(cond: object, what: str) -> None:
        for _ in range(400):  # readiness-driven: 40 s at most on a loaded host
            if cond():  # type: ignore[operator]
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; stats {index.stats}")

    async def run() -> None:
        sub.start()
        try:
            # PUB/SUB slow joiner: publish probes until the subscriber has one
            probe = [1] * BS
            while index.stats.stored_blocks == 0:
                pub.publish(_batch(_stored([7], None, probe)))
                await asyncio.sleep(0.1)
            pub.publish(_batch(AllBlocksCleared()))
            await until(lambda: index.stats.cleared == 1, "the clear")
            pub.publish(_batch(_stored([11, 12], None, prompt[:2 * BS])))
            pub.publish(_batch(_stored([13, 14, 15], 12, prompt[2 * BS:5 * BS])))
            await until(lambda: _cached(manager, prompt) == 5 * BS, "5 blocks cached")
            pub.publish(_batch(BlockRemoved(block_hashes=[14], medium="GPU", group_idx=0)))
            await until(lambda: _cached(manager, prompt) == 3 * BS, "the eviction")
        finally:
            await sub.stop()

    try:
        asyncio.run(run())
    finally:
        pub.shutdown()
    assert index.stats.removed_blocks == 1 and index.stats.resets == 0


def test_sequence_gap_resets_and_extra_keys_are_not_counted() -> None:
    import msgspec

    prompt = [random.Random(1).randrange(3, 1000) for _ in range(2 * BS)]
    enc = msgspec.msgpack.Encoder()
    manager = _manager()
    sub = VllmKvEvents({"prfaas-0": "tcp://127.0.0.1:1"}, manager, BS)
    sub.handle("prfaas-0", 0, enc.encode(_batch(_stored([1, 2], None, prompt))))
    assert _cached(manager, prompt) == 2 * BS
    sub.handle("prfaas-0", 2, enc.encode(_batch()))  # batch 1 was lost: state unknown
    assert _cached(manager, prompt) == 0 and sub.indexes["prfaas-0"].stats.resets == 1
    # a block whose vLLM identity includes a cache_salt cannot be hit by a plain prompt
    salted = _stored([1, 2], None, prompt, extra_keys=[("salt",), None])
    sub.handle("prfaas-0", 3, enc.encode(_batch(salted)))
    assert _cached(manager, prompt) == 0
    sub.handle("prfaas-0", 4, b"\xc1not msgpack")
    assert sub.bad_batches == 1 and sub.indexes["prfaas-0"].stats.resets == 2


def test_a_hybrid_batch_is_applied_whole_and_a_wrong_block_size_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's own BlockStored structs as a hybrid step sends them: the GDN group's event (the
    step's tokens, a hash only for the block whose state it kept) before the attention group's
    that names that hash. The subscriber places the state (batch applied whole); a subscriber
    in another block size places nothing and says so once."""
    import msgspec

    prompt = [random.Random(2).randrange(3, 1000) for _ in range(2 * BS)]
    from vllm.distributed.kv_events import BlockStored

    common = {"parent_block_hash": None, "token_ids": prompt, "block_size": BS,
              "lora_id": None, "medium": "GPU", "lora_name": None}
    state = BlockStored(block_hashes=[2], group_idx=0, kv_cache_spec_kind="mamba", **common)
    attn = BlockStored(block_hashes=[1, 2], group_idx=1, kv_cache_spec_kind="full_attention",
                       **common)
    payload = msgspec.msgpack.Encoder().encode(_batch(state, attn))
    manager = _manager()
    sub = VllmKvEvents({"prfaas-0": "tcp://127.0.0.1:1"}, manager, BS)
    sub.handle("prfaas-0", 0, payload)
    assert _cached(manager, prompt) == 2 * BS  # state after block 2 placed: a hit there
    assert sub.indexes["prfaas-0"].stats.unplaced_blocks == 0

    other = GlobalKVCacheManager(2 * BS)
    other.add_instance("prfaas-0", "prfaas")
    wrong = VllmKvEvents({"prfaas-0": "tcp://127.0.0.1:1"}, other, 2 * BS)
    with caplog.at_level("WARNING", logger="prfaas.integrations.vllm.kv_events"):
        wrong.handle("prfaas-0", 0, payload)
        wrong.handle("prfaas-0", 1, payload)
    said = [r.getMessage() for r in caplog.records if "block size" in r.getMessage()]
    assert len(said) == 1 and f"block size is {BS} tokens" in said[0], said
    assert wrong.indexes["prfaas-0"].stats.unplaced_blocks == 6
