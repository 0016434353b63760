"""stream_prefill: layers leave while later layers compute; a failed compute aborts."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from prfaas.transport import KVReceiver, KVSender, LayerSink, PeerAborted, stream_prefill

LAYERS = 5
COMPUTE_S = 0.06  # per layer


def _compute(sink: LayerSink) -> float:
    """A stand-in prefill: sleeps per layer (releasing the GIL like torch), emits its KV."""
    for layer in range(LAYERS):
        time.sleep(COMPUTE_S)
        sink(layer, "mla", [("kv", np.full((32, 16), layer, np.float32))])
    return time.monotonic()


def _failing(sink: LayerSink) -> None:
    sink(0, "mla", [("kv", np.zeros(4, np.float32))])
    raise RuntimeError("out of memory at layer 1")


def test_layers_arrive_while_compute_runs_then_end() -> None:
    arrivals: dict[int, float] = {}

    def on_tensor(_rid: int, layer: int, _name: str, _array: np.ndarray) -> None:
        arrivals[layer] = time.monotonic()

    async def body() -> float:
        rx = KVReceiver(on_tensor=on_tensor)
        await rx.start()
        async with KVSender("127.0.0.1", rx.port) as tx:
            compute_end_s = await stream_prefill(tx, 4, _compute)
            kv = await rx.wait_request(4, timeout_s=5)
        await rx.close()
        assert sorted(kv.layers) == list(range(LAYERS))
        assert all(float(kv.layers[i]["kv"][0, 0]) == i for i in range(LAYERS))
        return compute_end_s

    compute_end_s = asyncio.run(asyncio.wait_for(body(), 15))
    # Layer 0 was received while layers 1..4 still had >= 4 x 60 ms of compute ahead.
    assert arrivals[0] < compute_end_s - 2 * COMPUTE_S
    assert [arrivals[i] for i in range(LAYERS)] == sorted(arrivals.values())


def test_failed_compute_aborts_the_request_on_the_wire() -> None:
    async def body() -> None:
        async with KVReceiver() as rx, KVSender("127.0.0.1", rx.port) as tx:
            with pytest.raises(RuntimeError, match="out of memory"):
                await stream_prefill(tx, 8, _failing)
            with pytest.raises(PeerAborted, match="prefill failed: RuntimeError: out of memory"):
                await rx.wait_request(8, timeout_s=5)

    asyncio.run(asyncio.wait_for(body(), 15))
