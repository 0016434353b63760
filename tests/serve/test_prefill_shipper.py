"""The native prefill worker's KV through its layer shipper, over a real socket to a KVReceiver.

With the shipper on a fake asynchronous device (tests/engine/fake_device.py: its copies land
later, on its own threads; the engine still computes on the CPU) the transfer that arrives is
bitwise the engine's own export and its manifest verifies, exactly as on the CPU path. A
device copy that fails makes the prefill answer 502 `transfer_failed` and the receiver never
gets a complete transfer: no partial KV passes for a whole one; the failed request's host
ring slots are all given back.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from serve_helpers import topology

from prfaas.core.errors import TransportError
from prfaas.engine import Engine, EngineConfig
from prfaas.engine.profiler import prompt_tokens
from prfaas.engine.shipper import LayerShipper
from prfaas.models.engine_config import LAYER_KINDS
from prfaas.serve.worker.kvship import read_shipped
from prfaas.serve.worker.manifest import Binding, verify
from prfaas.serve.worker.prefill_worker import PrefillWorker
from prfaas.transport import KVReceiver, ReceiverConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
from fake_device import FakeAsyncDevice

TOKENS = 200  # 3 full blocks of 64 and a partial one


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig.tiny())


def _worker(engine: Engine, device: FakeAsyncDevice | None) -> PrefillWorker:
    topo = topology()
    worker = PrefillWorker(topo, topo.worker("prfaas-0"), engine)
    if device is not None:
        worker.shipper = LayerShipper(device, ring_bytes=4 << 20)
    return worker


async def _prefill(worker: PrefillWorker, rid: int, tokens: list[int]
                   ) -> tuple[int, dict[str, Any], Any]:
    receiver = KVReceiver(ReceiverConfig(port=0, frame_timeout_s=5.0, arena_bytes=0))
    await receiver.start()
    try:
        async with TestServer(worker.app()) as server, TestClient(server) as client:
            resp = await client.post("/prefill", json={
                "request_id": rid, "token_ids": tokens, "nonce": "n1", "kv_deadline_s": 20,
                "dest": {"host": "127.0.0.1", "port": receiver.port}})
            reply = await resp.json()
            try:
                received: Any = await receiver.wait_request(rid, 3.0)
            except TransportError as exc:
                received = exc
            return resp.status, reply, received
    finally:
        await receiver.close()


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake-async-device"])
def test_the_shipped_transfer_is_the_engines_export_and_verifies(engine: Engine,
                                                                 fake: bool) -> None:
    device = FakeAsyncDevice() if fake else None
    try:
        worker = _worker(engine, device)
        tokens = prompt_tokens(TOKENS, seed=3)
        status, reply, received = asyncio.run(_prefill(worker, 7, tokens))
        assert status == 200, reply
        assert not isinstance(received, Exception), received
        verify(received, Binding(7, "n1", worker.model_id, engine.config.layer_pattern, 0,
                                 tuple(tokens)), LAYER_KINDS)
        shipped = read_shipped(received, engine.config.num_layers)
        want = engine.prefill(tokens).kv.export(0, TOKENS)
        assert len(shipped.layers) == len(want) == engine.config.num_layers
        for got, exp in zip(shipped.layers, want, strict=True):
            assert sorted(got.tensors) == sorted(exp.tensors)
            for name in exp.tensors:
                assert _bytes(got.tensors[name]) == _bytes(exp.tensors[name]), (got.layer_index,
                                                                               name)
        metrics = worker.shipper.metrics
        assert metrics.failed_tickets == 0 and metrics.tickets == sum(
            len(layer.tensors) for layer in want)
        if fake:
            assert metrics.staged_bytes == metrics.bytes > 0
            assert worker.shipper.ring is not None and worker.shipper.ring.used_bytes == 0
    finally:
        if device is not None:
            device.stop()


def test_a_failed_device_copy_fails_the_prefill_and_no_whole_transfer_arrives(
        engine: Engine) -> None:
    device = FakeAsyncDevice(fail_copy=4)
    try:
        worker = _worker(engine, device)
        status, reply, received = asyncio.run(_prefill(worker, 8, prompt_tokens(TOKENS)))
        assert status == 502 and reply["error"]["type"] == "transfer_failed"
        assert "device copy failed" in reply["error"]["message"]
        assert isinstance(received, TransportError)  # aborted or never ended: not a transfer
        assert worker.shipper.metrics.failed_tickets == 1
        assert worker.failed_transfers == 1
        assert worker.shipper.ring is not None and worker.shipper.ring.used_bytes == 0
    finally:
        device.stop()


def test_the_prefill_computes_while_the_device_holds_every_copy(engine: Engine) -> None:
    """The device runs none of the shipper's copies until the engine has finished: the
    prefill's `computed` progress line still arrives (the model thread waited on nothing),
    and once the device runs the whole transfer arrives and verifies."""
    device = FakeAsyncDevice(hold=True)
    tokens = prompt_tokens(TOKENS, seed=4)

    async def run() -> tuple[str, int, Any]:
        worker = _worker(engine, device)
        receiver = KVReceiver(ReceiverConfig(port=0, frame_timeout_s=5.0, arena_bytes=0))
        await receiver.start()
        try:
            async with TestServer(worker.app()) as server, TestClient(server) as client:
                resp = await client.post("/prefill", json={
                    "request_id": 9, "token_ids": tokens, "nonce": "n1", "kv_deadline_s": 20,
                    "progress": True, "dest": {"host": "127.0.0.1", "port": receiver.port}})
                first = await asyncio.wait_for(resp.content.readline(), 20.0)
                held_copies = device.copy.ran
                device.open()
                last = json.loads(await resp.content.readline())
                received = await receiver.wait_request(9, 10.0)
                verify(received, Binding(9, "n1", worker.model_id,
                                         engine.config.layer_pattern, 0, tuple(tokens)),
                       LAYER_KINDS)
                return first.decode(), held_copies, last
        finally:
            await receiver.close()

    try:
        first, held_copies, last = asyncio.run(run())
    finally:
        device.stop()
    assert json.loads(first) == {"event": "computed"}
    assert held_copies == 0  # the copy stream sat on its first wait: nothing copied yet
    assert last["computed_tokens"] == TOKENS and "error" not in last
