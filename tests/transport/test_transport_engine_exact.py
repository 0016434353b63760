"""The issue's exactness proof: a real prefill's KV and states cross the transport (4 TCP
connections, token-bucket rate limit, layer by layer while the prefill computes) and arrive
bitwise equal to a local prefill's; greedy decode from what arrived gives exactly the tokens
of `Engine.generate`, for prompts from 1 to 8K tokens, with and without a cached prefix."""

from __future__ import annotations

import asyncio
from functools import cache

import numpy as np
import pytest

from prfaas.engine import DecodeSeq, Engine, EngineConfig, LayerKV
from prfaas.engine.wire_adapter import layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.transport import KVReceiver, KVSender, LayerSink, SenderConfig, stream_prefill

MAX_TOKENS = 8
RANGE = "range"  # per layer: int64 [start, end] of the tokens its tensors cover


@cache
def engine() -> Engine:
    return Engine(EngineConfig.tiny(threads=1))


@cache
def prompt(length: int) -> list[int]:
    rng = np.random.default_rng(length)
    return [256, *rng.integers(0, 256, size=length - 1).tolist()]


@cache
def local(length: int) -> tuple[object, list[int]]:
    """The local prefill of the whole prompt and the reference `generate` tokens."""
    eng, ids = engine(), prompt(length)
    return eng.prefill(ids), eng.generate(ids, MAX_TOKENS)


async def _ship(ids: list[int], cached_tokens: int) -> tuple[dict[int, dict[str, np.ndarray]],
                                                             dict[int, str], int]:
    eng = engine()
    base, _ = local(len(ids))
    prefix = base.kv.snapshot_at(cached_tokens) if cached_tokens else None  # type: ignore[attr-defined]
    rx = KVReceiver()
    await rx.start()
    try:
        config = SenderConfig(num_connections=4, rate_gbps=2.0)
        async with KVSender("127.0.0.1", rx.port, config) as tx:

            def compute(sink: LayerSink) -> int:
                def on_layer(kv: LayerKV) -> None:
                    span = np.array([kv.start_token, kv.end_token], dtype=np.int64)
                    sink(kv.layer_index, kv.kind, [*layer_kv_to_arrays(kv), (RANGE, span)])
                return eng.prefill(ids, prefix=prefix, on_layer=on_layer).first_token

            first_token = await stream_prefill(tx, 7, compute)
            received = await rx.wait_request(7, timeout_s=60)
            assert tx.stats().per_connection_bytes and min(tx.stats().per_connection_bytes) > 0
    finally:
        await rx.close()
    return received.layers, received.kinds, first_token


@pytest.mark.parametrize(("length", "cached_tokens"), [
    (1, 0), (100, 0), (700, 0), (700, 640), (8192, 0), (8192, 8128)])
def test_shipped_kv_is_bitwise_local_and_decodes_like_generate(length: int,
                                                              cached_tokens: int) -> None:
    eng, ids = engine(), prompt(length)
    base, reference = local(length)
    layers, kinds, first_token = asyncio.run(asyncio.wait_for(_ship(ids, cached_tokens), 120))
    assert sorted(layers) == list(range(eng.config.num_layers))
    received: list[LayerKV] = []
    for i in range(eng.config.num_layers):
        arrays = dict(layers[i])
        start, end = (int(v) for v in arrays.pop(RANGE))
        assert end == length and start == (cached_tokens if kinds[i] != "linear" else start)
        mine = base.kv.export_layer(i, start, end)  # type: ignore[attr-defined]
        theirs = layer_kv_from_arrays(i, kinds[i], start, end, sorted(arrays.items()))
        for name, tensor in mine.tensors.items():
            assert theirs.tensors[name].numpy().tobytes() == tensor.numpy().tobytes(), (i, name)
        received.append(theirs)
    # the decode node holds the cached prefix itself and rebuilds the rest from the wire
    held = base.kv.snapshot_at(cached_tokens) if cached_tokens else None  # type: ignore[attr-defined]
    seq = DecodeSeq(eng.import_kv(received, prefix=held, token_ids=ids), first_token)
    tokens = [first_token]
    while len(tokens) < MAX_TOKENS and tokens[-1] != eng.tokenizer.eos_id:
        tokens.append(eng.decode_step([seq])[0])
    assert [t for t in tokens if t != eng.tokenizer.eos_id] == reference
