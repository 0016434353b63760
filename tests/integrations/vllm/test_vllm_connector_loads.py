"""PrfaasConnector's worker halves over real sockets, without a vLLM instance: a producer half
streams a request's KV and recurrent state to a consumer half (prfaas.transport, loopback).

What must hold: a complete, matching transfer is reported received with every value in place
(the conv state converted between the SD and DS layouts when the two ends differ); a short
tensor, a missing layer, another prompt's fingerprint, a transfer without a manifest, or a
connection dropped in the middle of a layer is reported to vLLM as a failed load
(`failed_recving`), which vLLM turns into an error for the request and the router into a local
retry: never a load reported good from wrong KV.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from needs import needs

pytestmark = needs("vllm")

import torch  # noqa: E402

from prfaas.integrations.vllm.blocks import conv_from_wire, conv_to_wire  # noqa: E402
from prfaas.serve.ports import free_port  # noqa: E402
from prfaas.transport.sender import KVSender, SenderConfig  # noqa: E402

BS = 16  # tokens per attention block
HEAD = 32  # a head size vLLM's CPU attention kernels take (the connector reads their layout)
NUM_BLOCKS = 32
TOKENS = 5 * BS + 3  # 6 attention blocks, the last partial
CONV_SD, SSM = (3, 16), (2, 4, 4)
PAGE = 3 * 16 * 2 + 2 * 4 * 4 * 4  # conv bf16 + ssm fp32, packed as vLLM packs a Mamba page
GDN, ATTN = "model.layers.0.linear_attn", "model.layers.1.self_attn.attn"


def _config(layout: str) -> Any:
    conv = CONV_SD if layout == "SD" else CONV_SD[::-1]
    mamba = SimpleNamespace(block_size=BS, shapes=(conv, SSM),
                            dtypes=(torch.bfloat16, torch.float32))
    attn = SimpleNamespace(block_size=BS, num_kv_heads=2, head_size=HEAD)  # [n, 2, BS, 2 * HEAD]
    return SimpleNamespace(num_blocks=NUM_BLOCKS, kv_cache_groups=[
        SimpleNamespace(layer_names=[GDN], kv_cache_spec=mamba),
        SimpleNamespace(layer_names=[ATTN], kv_cache_spec=attn)])


def _caches(seed: int | None) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed or 0)
    page = torch.zeros(NUM_BLOCKS, 1, 1, PAGE, dtype=torch.int8)
    kv = torch.zeros(NUM_BLOCKS, 2, BS, 2 * HEAD, dtype=torch.bfloat16)
    if seed is not None:
        page = torch.randint(-128, 128, page.shape, generator=gen, dtype=torch.int8)
        kv = torch.randn(kv.shape, generator=gen).to(torch.bfloat16)
    return {GDN: page, ATTN: kv}


def _half(layout: str, producer: bool, port: int = 0, trace: str | None = None) -> Any:
    from prfaas.integrations.vllm.worker_half import WorkerHalf

    extra: dict[str, Any] = {"conv_state_layout": layout, "kv_port": port,
                             "frame_timeout_s": 3.0, "connections": 2, "trace_path": trace}
    half = WorkerHalf(_config(layout), extra, producer=producer, consumer=not producer)
    half.register(_caches(seed=1 if producer else None))
    return half


SRC_BLOCKS, DST_BLOCKS = [3, 9, 4, 11, 5, 20], [7, 8, 1, 2, 30, 31]
SRC_SLOT, DST_SLOT = 6, 12


@pytest.fixture
def pair(tmp_path: Any) -> Any:
    port = free_port()
    rx = _half("SD", producer=False, port=port, trace=str(tmp_path / "rx.trace"))
    yield rx, port
    rx.shutdown()


def _expect(rx: Any, tid: int, fp: int = 77, timeout_s: float = 20.0,
            fault: str | None = None) -> None:
    from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata

    job = LoadJob(f"req-{tid}", tid, ([DST_SLOT], list(DST_BLOCKS)), (DST_SLOT, None), 0,
                  TOKENS, fp, timeout_s, fault)
    rx.start_loads(PrfaasMetadata(loads=[job]))


def _outcome(rx: Any, tid: int, within_s: float = 30.0) -> str:
    """'ok', or 'failed: why' as the connector reports it to vLLM (get_transfer_results; the
    reason from the receiver's trace)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        finished, failed = rx.results()
        if f"req-{tid}" in finished:
            if f"req-{tid}" not in failed:
                return "ok"
            with open(rx._trace_path) as f:
                done = [json.loads(line) for line in f if '"done"' in line]
            return f"failed: {next(e['error'] for e in done if e['tid'] == tid)}"
        time.sleep(0.05)
    raise AssertionError(f"transfer {tid} never reported")


def _stream(port: int, tid: int, layout: str = "SD", fp: int = 77,
            wire_dtype: str | None = None) -> Any:
    """A producer half sends one whole request (meta, attention blocks, states, END)."""
    from prfaas.integrations.vllm.metadata import PrfaasMetadata, SaveJob

    tx = _half(layout, producer=True)
    job = SaveJob(f"p-{tid}", tid, ("127.0.0.1", port), (([], 0), (list(SRC_BLOCKS), 0)),
                  TOKENS, fp, True, True, (SRC_SLOT, None), wire_dtype=wire_dtype)
    meta = PrfaasMetadata(saves=[job])
    tx.save_layer(meta, ATTN, tx.caches[ATTN])
    tx.end_step(meta)
    return tx


def _conv(page: Any, shape: tuple[int, ...]) -> Any:
    return page.reshape(-1)[: 2 * int(np.prod(shape))].view(torch.bfloat16).view(shape)


@pytest.mark.parametrize("sender_layout", ["SD", "DS"])
def test_a_complete_transfer_lands_every_value_in_either_conv_layout(pair: Any,
                                                                    sender_layout: str) -> None:
    rx, port = pair
    _expect(rx, 1)
    tx = _stream(port, 1, sender_layout)
    try:
        assert _outcome(rx, 1) == "ok"
    finally:
        tx.shutdown()
    with open(rx._trace_path) as f:  # the receiver's own count, tensor by tensor
        received = sum(e["bytes"] for e in map(json.loads, f) if e["ev"] == "tensor")
    assert tx.take_sent_bytes() == {"p-1": received} and tx.take_sent_bytes() == {}
    assert received == 24 + 6 * 2 * BS * 2 * HEAD * 2 + PAGE  # meta, 6 bf16 blocks, one state page
    src, dst = tx.caches, rx.caches
    assert torch.equal(dst[ATTN][DST_BLOCKS].view(torch.int16),
                       src[ATTN][SRC_BLOCKS].view(torch.int16))
    src_page, dst_page = src[GDN][SRC_SLOT], dst[GDN][DST_SLOT]
    sd = _conv(src_page, CONV_SD) if sender_layout == "SD" else _conv(src_page, CONV_SD[::-1]).T
    assert torch.equal(_conv(dst_page, CONV_SD).view(torch.int16), sd.view(torch.int16))
    assert torch.equal(dst_page.reshape(-1)[96:], src_page.reshape(-1)[96:])  # the SSM state
    assert not torch.equal(dst[ATTN][0], src[ATTN][0])  # (a block that did not cross differs)


def test_kv_that_arrives_before_the_blocks_are_allocated_lands_exactly(pair: Any) -> None:
    """A decoder short of blocks: vLLM allocates the request's blocks (start_loads) only after
    the whole transfer is in. The receiver keeps those tensors aside (the trace's `load`
    event counts them) and writes them at allocation: every value as if it had waited."""
    rx, port = pair
    tx = _stream(port, 2)
    try:
        deadline = time.monotonic() + 20
        while True:  # the meta, the 6 blocks and the state are in before any block exists
            trace = Path(rx._trace_path)
            lines = trace.read_text().splitlines() if trace.exists() else []
            got = [e for e in map(json.loads, lines) if e["ev"] == "tensor" and e["tid"] == 2]
            if len(got) == 3:
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        _expect(rx, 2)
        assert _outcome(rx, 2) == "ok"
    finally:
        tx.shutdown()
    with open(rx._trace_path) as f:
        [load] = [e for e in map(json.loads, f) if e["ev"] == "load" and e["tid"] == 2]
    assert load["held"] == 3  # meta, the blocks' tensor, the state page: all held
    src, dst = tx.caches, rx.caches
    assert torch.equal(dst[ATTN][DST_BLOCKS].view(torch.int16),
                       src[ATTN][SRC_BLOCKS].view(torch.int16))
    assert torch.equal(dst[GDN][DST_SLOT].reshape(-1)[96:], src[GDN][SRC_SLOT].reshape(-1)[96:])


@pytest.mark.parametrize("fault", ["zero_state", "foreign_conv", "shift_blocks"])
def test_the_negative_controls_write_what_they_claim(pair: Any, fault: str) -> None:
    """The receiver-side faults of the live hybrid test's controls (params.FAULTS)."""
    rx, port = pair
    _expect(rx, 5)
    first = _stream(port, 5)  # a first request: its conv is the next one's "foreign" conv
    assert _outcome(rx, 5) == "ok"
    first.shutdown()
    first_conv = _conv(rx.caches[GDN][DST_SLOT], CONV_SD).clone()
    rx.register(_caches(seed=None))
    _expect(rx, 6, fault=fault)
    tx = _half("SD", producer=True)
    tx.caches = _caches(seed=2)  # another request's values
    tx.register(tx.caches)
    from prfaas.integrations.vllm.metadata import PrfaasMetadata, SaveJob

    meta = PrfaasMetadata(saves=[SaveJob("p-6", 6, ("127.0.0.1", port),
                                         (([], 0), (list(SRC_BLOCKS), 0)), TOKENS, 77, True,
                                         True, (SRC_SLOT, None))])
    tx.save_layer(meta, ATTN, tx.caches[ATTN])
    tx.end_step(meta)
    assert _outcome(rx, 6) == "ok"  # the load itself succeeds: only the data is wrong
    tx.shutdown()
    src, dst = tx.caches, rx.caches
    page, src_page = dst[GDN][DST_SLOT].reshape(-1), src[GDN][SRC_SLOT].reshape(-1)
    conv = _conv(dst[GDN][DST_SLOT], CONV_SD)
    kv_right = torch.equal(dst[ATTN][DST_BLOCKS].view(torch.int16),
                           src[ATTN][SRC_BLOCKS].view(torch.int16))
    if fault == "zero_state":
        assert not page[96:].any() and src_page[96:].any()
        assert torch.equal(conv.view(torch.int16), _conv(src_page, CONV_SD).view(torch.int16))
        assert kv_right
    elif fault == "foreign_conv":
        assert torch.equal(conv.view(torch.int16), first_conv.view(torch.int16))
        assert not torch.equal(conv.view(torch.int16), _conv(src_page, CONV_SD).view(torch.int16))
        assert torch.equal(page[96:], src_page[96:]) and kv_right
    else:
        assert torch.equal(dst[ATTN][DST_BLOCKS[1:]].view(torch.int16),
                           src[ATTN][SRC_BLOCKS[:-1]].view(torch.int16))
        assert not kv_right and torch.equal(page, src_page)


def test_conv_layout_conversion_on_tensors() -> None:
    gen = torch.Generator().manual_seed(3)
    sd = torch.randn(1, *CONV_SD, generator=gen).to(torch.bfloat16)
    ds = sd.transpose(-1, -2).contiguous()
    wire_sd = conv_to_wire(sd, CONV_SD, torch.bfloat16, "SD")
    wire_ds = conv_to_wire(ds, CONV_SD[::-1], torch.bfloat16, "DS")
    assert torch.equal(wire_sd.reshape(-1), wire_ds.reshape(-1))  # one wire form (bytes)
    assert torch.equal(conv_from_wire(wire_sd, CONV_SD, torch.bfloat16, "SD"), sd)
    assert torch.equal(conv_from_wire(wire_ds, CONV_SD[::-1], torch.bfloat16, "DS"), ds)
    # a negative control: a receiver that skipped the conversion would hold other values
    assert not torch.equal(wire_sd.reshape(-1), sd.reshape(-1))


def _send_items(port: int, items: list[tuple[int, str, np.ndarray, bool]], tid: int,
                drop_mid_layer: bool = False, rx: Any = None) -> None:
    """Hand-made frames on a KVSender (the bad peers a producer half never is); with `rx`, END
    carries the manifest a producer half would send for these very frames (what `rx` expects
    of the request, every tensor's digest): the checks after the manifest's are then shown."""
    from prfaas.integrations.vllm import kv_security as sec

    manifest = b""
    if rx is not None:
        ledger = sec.Ledger()
        for layer, name, array, _ in items:
            ledger.add(layer, name, array)
        manifest = ledger.encode(sec.head(tid, "", rx.model_id, rx.layer_sets(), TOKENS, ""))

    async def run() -> None:
        sender = KVSender("127.0.0.1", port, SenderConfig(
            num_connections=1, chunk_bytes=1024, rate_gbps=None if not drop_mid_layer
            else 0.0002))
        await sender.connect()
        for layer, name, array, bf16 in items:
            if drop_mid_layer and name.startswith("b"):
                task = asyncio.ensure_future(sender.send_array(tid, layer, "gqa", name, array,
                                                               bfloat16=bf16))
                await asyncio.sleep(0.4)  # ~10 KB of the layer's 32 KB are out
                await sender.close()  # the connection drops with the layer half sent
                task.cancel()
                return
            await sender.send_array(tid, layer, "gqa", name, array, bfloat16=bf16)
        await sender.finish(tid, manifest=manifest)
        await sender.close()

    asyncio.run(run())


def _good_items(rx: Any, fp: int = 77) -> list[tuple[int, str, np.ndarray, bool]]:
    from prfaas.integrations.vllm.blocks import to_wire

    src = _caches(seed=1)
    meta = np.array([TOKENS, fp, rx.layout_fingerprint()], np.int64)
    kv, bf16 = to_wire(src[ATTN][SRC_BLOCKS])
    state, _ = to_wire(conv_to_wire(src[GDN][SRC_SLOT : SRC_SLOT + 1], CONV_SD,
                                    torch.bfloat16, "SD"))
    return [(0, "meta", meta, False), (1, "b0", kv, bf16), (0, "s0", state, False)]


def test_the_good_hand_made_transfer_is_received(pair: Any) -> None:
    rx, port = pair  # the control for the four below: the same frames, unaltered
    _expect(rx, 2)
    _send_items(port, _good_items(rx), 2, rx=rx)
    assert _outcome(rx, 2) == "ok"


@pytest.mark.parametrize(("fault", "why"), [("short_tensor", "blocks [5] missing"),
                                            ("missing_layer", "recurrent state missing"),
                                            ("wrong_fingerprint", "prompt fingerprint differs"),
                                            ("no_manifest", "carries no manifest")])
def test_a_partial_or_mismatched_transfer_is_a_failed_load(pair: Any, fault: str, why: str
                                                           ) -> None:
    rx, port = pair
    items = _good_items(rx)
    if fault == "short_tensor":  # one block fewer than the request's 6
        layer, name, kv, bf16 = items[1]
        items[1] = (layer, name, kv[:-1], bf16)
    elif fault == "missing_layer":  # no recurrent state for the GDN layer
        items = items[:2]
    elif fault == "wrong_fingerprint":  # the KV of another prompt (the same transfer id)
        items = _good_items(rx, fp=78)
    _expect(rx, 3)
    _send_items(port, items, 3, rx=None if fault == "no_manifest" else rx)
    outcome = _outcome(rx, 3)
    assert outcome.startswith("failed") and why in outcome, outcome


def test_a_connection_dropped_mid_layer_is_a_failed_load(pair: Any) -> None:
    rx, port = pair
    _expect(rx, 4, timeout_s=10.0)
    sent = threading.Thread(target=_send_items, args=(port, _good_items(rx), 4, True))
    sent.start()
    sent.join(30)
    outcome = _outcome(rx, 4)
    print(outcome)
    assert outcome.startswith("failed"), outcome


# -- fp8 on the wire (wire_quant.py) -------------------------------------------------------------
CODES_BYTES = 6 * 2 * BS * 2 * HEAD  # one e4m3 code per element of the 6 blocks
SCALE_BYTES = 6 * BS // 16 * 2 * 2 * 4  # fp32 per 16 tokens, per head (2), per K and V


def _vllm_writes(keys: Any, values: Any, num_blocks: int, bs: int = BS) -> Any:
    """A [num_blocks, H, bs, 2 * D] bf16 cache into which vLLM's own CPU attention op
    (`cpu_attn_reshape_and_cache`, as its attention layers call it) wrote `keys` and `values`
    ([T, H, D]) at slots 0..T-1."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    h, d = keys.shape[1:]
    cache = torch.zeros(num_blocks, h, bs, 2 * d, dtype=torch.bfloat16)
    key_half, value_half = cache.view(num_blocks, h, 2 * bs, d).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(keys.to(torch.bfloat16).contiguous(),
                                   values.to(torch.bfloat16).contiguous(), key_half, value_half,
                                   torch.arange(len(keys), dtype=torch.int64),
                                   _get_attn_isa(torch.bfloat16, bs, d))
    return cache


def _prompt_places() -> Any:
    """Where in the 6 blocks vLLM keeps the prompt's TOKENS tokens (True) and where it keeps
    nothing of it (the last block's places past the prompt), as its own op writes them."""
    ones = torch.ones(TOKENS, 2, HEAD)
    return _vllm_writes(ones, ones, 6) != 0


def _fp8_bound(x: Any) -> Any:
    """|dequantized - x| allowed: e4m3's half step, 2^-4 |x| (normal) or 2^-10 s (subnormal,
    s = absmax / 448 of the tensor, >= every block's scale), then the store into the bf16 cache
    rounds once more, 2^-8 of the value (transport/quant.py, docs/wire-format.md)."""
    x = x.float()
    s = x.abs().max() / 448
    q = (1 + 2**-4) * x.abs() + 2**-10 * s
    return 2**-4 * x.abs() + 2**-10 * s + 2**-8 * q + 1e-6


def test_fp8_transfer_lands_within_the_fp8_bound_and_counts_wire_bytes(pair: Any) -> None:
    from prfaas.integrations.vllm.wire_quant import BlockLayout

    rx, port = pair
    _expect(rx, 7)
    tx = _stream(port, 7, wire_dtype="fp8_e4m3")
    try:
        assert _outcome(rx, 7) == "ok"  # the manifest listed codes and scales as they crossed
    finally:
        tx.shutdown()
    with open(rx._trace_path) as f:
        tensors = [e for e in map(json.loads, f) if e["ev"] == "tensor"]
    assert {(e["name"], e["bytes"]) for e in tensors if e["name"].startswith("b")} == {
        ("b0", CODES_BYTES), ("b0.scale", SCALE_BYTES)}
    received = sum(e["bytes"] for e in tensors)
    assert tx.take_sent_bytes() == {"p-7": received}
    assert received == 24 + CODES_BYTES + SCALE_BYTES + PAGE  # (bf16 blocks: 2 x the codes)
    x = tx.caches[ATTN][SRC_BLOCKS].float()
    y = rx.caches[ATTN][DST_BLOCKS].float()
    valid = _prompt_places()  # what past the prompt's end is zeroed: where vLLM writes no token
    assert torch.all(((y - x).abs() <= _fp8_bound(x))[valid])
    assert not torch.equal(x[valid], y[valid])  # it did travel in fp8, not as bf16
    assert not y[~valid].any()
    # control: without the backend's page order the prompt's tail is cut from places that
    # hold the prompt's own keys
    plain = BlockLayout(2, BS, HEAD)
    rows = plain.token_major(tx.caches[ATTN][SRC_BLOCKS], 0)
    rows[TOKENS:] = 0
    cut = plain.from_token_major(rows, 0, torch.bfloat16)
    assert x[valid].all() and not cut[valid].all()
    # the GDN state keeps its dtype: bit-exact
    assert torch.equal(rx.caches[GDN][DST_SLOT], tx.caches[GDN][SRC_SLOT])


def test_int4_control_writes_a_coarser_kv_than_fp8(pair: Any) -> None:
    rx, port = pair
    _expect(rx, 8, fault="int4_kv")
    tx = _stream(port, 8)
    assert _outcome(rx, 8) == "ok"
    tx.shutdown()
    x, y = tx.caches[ATTN][SRC_BLOCKS].float(), rx.caches[ATTN][DST_BLOCKS].float()
    outside = ((y - x).abs() > _fp8_bound(x)).float().mean()
    assert outside > 0.5, outside  # most values outside fp8's bound
    # and within the 4-bit grid's: half a step of absmax / 7, then the bf16 store (2^-8)
    assert (y - x).abs().max() <= x.abs().max() / 14 + 2**-8 * x.abs().max() * 1.1


def test_wrong_scale_control_writes_fp8_values_twice_too_large(pair: Any) -> None:
    """`fp8_wrong_scale` (the live fp8 quality check's control): each value lands twice what
    the genuine fp8 transfer writes, so outside fp8's bound; and on a bf16 transfer it does
    nothing."""
    rx, port = pair
    _expect(rx, 9, fault="fp8_wrong_scale")
    tx = _stream(port, 9, wire_dtype="fp8_e4m3")
    assert _outcome(rx, 9) == "ok"
    tx.shutdown()
    x = tx.caches[ATTN][SRC_BLOCKS].float()
    y = rx.caches[ATTN][DST_BLOCKS].float()
    valid = _prompt_places()
    assert torch.all(((y / 2 - x).abs() <= _fp8_bound(x))[valid])  # the values, doubled
    big = valid & (x.abs() > x.abs().max() / 16)
    assert torch.all(((y - x).abs() > _fp8_bound(x))[big])
    _expect(rx, 10, fault="fp8_wrong_scale")
    tx = _stream(port, 10)  # bf16 on the wire: no scales, nothing to get wrong
    assert _outcome(rx, 10) == "ok"
    tx.shutdown()
    assert torch.equal(rx.caches[ATTN][DST_BLOCKS], tx.caches[ATTN][SRC_BLOCKS])


def _fp8_items(rx: Any) -> list[tuple[int, str, np.ndarray, bool]]:
    from prfaas.integrations.vllm.cpu_layout import with_cpu_page_order
    from prfaas.integrations.vllm.wire_quant import BlockLayout, encode_blocks

    items = _good_items(rx)
    blocks = _caches(seed=1)[ATTN][SRC_BLOCKS]
    layout = with_cpu_page_order(BlockLayout(2, BS, HEAD), torch.bfloat16)
    fp8 = [(1, n, a, False) for n, a in encode_blocks(blocks, 0, layout, TOKENS, "b0")]
    return [items[0], *fp8, items[2]]


@pytest.mark.parametrize(("fault", "why"), [
    (None, None), ("scale_altered", "'b0.scale' bytes do not match the manifest"),
    ("scale_missing", "'b0.scale' is in the manifest but was not received"),
    ("scale_missing_unlisted", "blocks [0, 1, 2, 3] missing")])
def test_fp8_codes_need_their_listed_scale(pair: Any, fault: str | None, why: str | None
                                           ) -> None:
    """The manifest digests the scales as they travel: an altered or missing scale fails the
    load (the unaltered frames are the control)."""
    from prfaas.integrations.vllm import kv_security as sec

    rx, port = pair
    items = _fp8_items(rx)
    sent = list(items)
    if fault == "scale_altered":
        scale = items[2][2].copy()
        scale[0] *= 2  # one block's scales, doubled
        sent[2] = (1, "b0.scale", scale, False)
    elif fault is not None:
        sent = [i for i in items if i[1] != "b0.scale"]
    listed = sent if fault == "scale_missing_unlisted" else items
    ledger = sec.Ledger()
    for layer, name, array, _ in listed:
        ledger.add(layer, name, array)
    manifest = ledger.encode(sec.head(9, "", rx.model_id, rx.layer_sets(), TOKENS, ""))

    async def run() -> None:
        sender = KVSender("127.0.0.1", port, SenderConfig(num_connections=2))
        await sender.connect()
        for layer, name, array, bf16 in sent:
            await sender.send_array(9, layer, "gqa", name, array, bfloat16=bf16)
        await sender.finish(9, manifest=manifest)
        await sender.close()

    _expect(rx, 9)
    asyncio.run(run())
    outcome = _outcome(rx, 9)
    if why is None:
        assert outcome == "ok"
    else:
        assert outcome.startswith("failed") and why in outcome, outcome


@pytest.mark.parametrize("layout", ["cpu", "flash"])
def test_block_layout_puts_tokens_first_and_back(layout: str) -> None:
    from prfaas.core.errors import TransportError
    from prfaas.integrations.vllm.cpu_layout import with_cpu_page_order
    from prfaas.integrations.vllm.wire_quant import BlockLayout

    h, n, nb = 2, BS, 3
    gen = torch.Generator().manual_seed(5)
    if layout == "cpu":  # [nb, H, N, 2D], written by vLLM's own CPU attention op
        d, dim = HEAD, 0
        keys = torch.randn(nb * n, h, d, generator=gen).to(torch.bfloat16)
        values = torch.randn(nb * n, h, d, generator=gen).to(torch.bfloat16)
        cache = _vllm_writes(keys, values, nb)
        lay = with_cpu_page_order(BlockLayout(h, n, d), torch.bfloat16)
    else:  # FlashAttention: [2, nb, N, H, D]
        d, dim = 4, 1
        cache = torch.randn(2, nb, n, h, d, generator=gen).to(torch.bfloat16)
        keys, values = (t.reshape(nb * n, h, d) for t in cache)
        lay = BlockLayout(h, n, d)
    rows = lay.token_major(cache, dim)  # [nb*N, H, 2, D]
    assert np.array_equal(rows[:, :, 0], keys.float().numpy())
    assert np.array_equal(rows[:, :, 1], values.float().numpy())
    back = lay.from_token_major(rows, dim, torch.bfloat16)
    assert torch.equal(back.view(torch.int16), cache.view(torch.int16))
    with pytest.raises(Exception, match="neither"):
        BlockLayout(h, n, 2 * d).token_major(cache, dim)  # a head size that does not fit
    if layout == "cpu":
        # control: the page read as a key half then a value half, both token-major (no page
        # order): the values come out right, the keys (stored dim-major) do not
        plain = BlockLayout(h, n, d).token_major(cache, dim)
        assert np.array_equal(plain[:, :, 1], values.float().numpy())
        assert not np.array_equal(plain[:, :, 0], keys.float().numpy())
        with pytest.raises(TransportError, match="not a permutation"):
            lay.with_page_order(np.zeros((n, 2, d), dtype=np.int64))


def test_the_page_order_is_part_of_the_layout_fingerprint(pair: Any) -> None:
    """Raw (bf16) blocks cross in the page order of the sender: a receiver whose kernel orders
    a page otherwise has another fingerprint, so it refuses them (the fingerprint check above)."""
    rx, _ = pair
    layout = rx.fp8_layouts[ATTN]
    assert layout.page_order is not None and rx._layout_fingerprint() == rx.layout_fingerprint()
    rx.fp8_layouts[ATTN] = layout.with_page_order(layout.page_order[::-1].copy())
    assert rx._layout_fingerprint() != rx.layout_fingerprint()


@pytest.mark.parametrize(("bs", "d"), [(256, 64), (272, 32)])
def test_the_page_order_is_read_for_blocks_longer_than_bf16_counts(bs: int, d: int) -> None:
    """A hybrid model's attention blocks are long (qwen3_next's tiny test model: 256 tokens, to
    match its Mamba page): token ids past 256 are not exact in bf16, so the layout is read in
    two digits. Keys and values written by vLLM come back token-major."""
    from prfaas.integrations.vllm.cpu_layout import with_cpu_page_order
    from prfaas.integrations.vllm.wire_quant import BlockLayout

    gen = torch.Generator().manual_seed(bs)
    keys = torch.randn(2 * bs, 1, d, generator=gen).to(torch.bfloat16)
    values = torch.randn(2 * bs, 1, d, generator=gen).to(torch.bfloat16)
    cache = _vllm_writes(keys, values, 2, bs)
    rows = with_cpu_page_order(BlockLayout(1, bs, d), torch.bfloat16).token_major(cache, 0)
    assert np.array_equal(rows[:, :, 0], keys.float().numpy())
    assert np.array_equal(rows[:, :, 1], values.float().numpy())


# -- the producer's layers through the layer shipper (engine/shipper.py) ------------------------
def _fake_device(**kw: Any) -> Any:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
    from fake_device import FakeAsyncDevice

    return FakeAsyncDevice(**kw)


def _step_on_model_thread(tx: Any, meta: Any) -> threading.Thread:
    """save_kv_layer then wait_for_save, as vLLM's forward calls them, on a thread of its own."""
    t = threading.Thread(target=lambda: (tx.save_layer(meta, ATTN, tx.caches[ATTN]),
                                         tx.end_step(meta)), name="model", daemon=True)
    t.start()
    return t


def _save_meta(tid: int, port: int) -> Any:
    from prfaas.integrations.vllm.metadata import PrfaasMetadata, SaveJob

    return PrfaasMetadata(saves=[SaveJob(f"p-{tid}", tid, ("127.0.0.1", port),
                                         (([], 0), (list(SRC_BLOCKS), 0)), TOKENS, 77, True,
                                         True, (SRC_SLOT, None))])


@pytest.mark.parametrize("path", [
    "shipper",
    pytest.param("naive", marks=pytest.mark.xfail(
        strict=True, reason="negative control: .cpu() per layer waits on the model thread")),
])
def test_the_producer_step_never_waits_on_the_device_and_lands_every_value(
        pair: Any, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fake asynchronous device held closed, vLLM's model thread runs the producer's
    whole last step (the layer's blocks, the GDN state, the END) while the device has run none
    of it, and digests nothing itself (the manifest's SHA-256 is taken beside the sender).
    Once the device runs, the load is complete and every value is in place."""
    from prfaas.engine.shipper import BlockingShipper, LayerShipper
    from prfaas.integrations.vllm import kv_security as sec

    digested: list[str] = []
    real_add = sec.Ledger.add

    def add(self: Any, layer: int, name: str, array: np.ndarray) -> None:
        digested.append(threading.current_thread().name)
        real_add(self, layer, name, array)

    monkeypatch.setattr(sec.Ledger, "add", add)
    rx, port = pair
    _expect(rx, 11)
    device = _fake_device(hold=True)
    tx = _half("SD", producer=True)
    tx.shipper = (LayerShipper(device, ring_bytes=1 << 20) if path == "shipper"
                  else BlockingShipper(device))
    try:
        model = _step_on_model_thread(tx, _save_meta(11, port))
        model.join(timeout=5.0)
        issued_while_held = not model.is_alive()
        device.open()
        model.join(timeout=30)
        assert _outcome(rx, 11) == "ok"
    finally:
        tx.shutdown()
        device.stop()
    assert torch.equal(rx.caches[ATTN][DST_BLOCKS].view(torch.int16),
                       tx.caches[ATTN][SRC_BLOCKS].view(torch.int16))
    assert torch.equal(rx.caches[GDN][DST_SLOT].reshape(-1)[96:],
                       tx.caches[GDN][SRC_SLOT].reshape(-1)[96:])
    with open(rx._trace_path) as f:
        received = sum(e["bytes"] for e in map(json.loads, f) if e["ev"] == "tensor")
    assert tx.take_sent_bytes() == {"p-11": received}
    assert len(digested) == 3 and "model" not in digested  # meta, blocks, state page
    assert issued_while_held, "the model thread waited for the device"
    assert device.waits_of("model") == []


def test_a_failed_device_copy_is_a_failed_load_never_a_partial_one(pair: Any) -> None:
    """The layer's blocks fail to copy off the device: the producer aborts the transfer (the
    receiver hears it at once, not at its timeout) and vLLM is told the load failed."""
    from prfaas.engine.shipper import LayerShipper

    rx, port = pair
    _expect(rx, 12)
    device = _fake_device(fail_copy=1)  # the first copy: the attention blocks
    tx = _half("SD", producer=True)
    tx.shipper = LayerShipper(device, ring_bytes=1 << 20)
    try:
        t0 = time.monotonic()
        meta = _save_meta(12, port)
        tx.save_layer(meta, ATTN, tx.caches[ATTN])
        tx.end_step(meta)
        outcome = _outcome(rx, 12)
        took_s = time.monotonic() - t0
    finally:
        tx.shutdown()
        device.stop()
    assert outcome.startswith("failed") and "fake DMA fault" in outcome, outcome
    assert took_s < 10.0  # the ABORT, not the 20 s load timeout
    assert tx.shipper.metrics.failed_tickets == 1
    assert tx.shipper.ring is not None and tx.shipper.ring.used_bytes == 0


def test_a_producer_asks_for_piecewise_cuda_graphs_and_a_consumer_does_not() -> None:
    """FULL graphs would replay the producer's forward without save_kv_layer; a consumer
    saves nothing and keeps them (the extra configs are the ones the deployment writes)."""
    from prfaas.integrations.vllm.connector import PrfaasConnector
    from prfaas.integrations.vllm.deploy import worker_spec
    from prfaas.serve.topology import load_topology

    topo = load_topology(Path(__file__).resolve().parents[3] / "topologies"
                         / "vllm-local.yaml").with_ports()
    specs = {w.role: worker_spec(topo, w) for w in topo.workers}
    assert {r: s.kv_role for r, s in specs.items()} == {
        "prfaas": "kv_producer", "pd-p": "kv_producer", "pd-d": "kv_consumer"}
    for role, spec in specs.items():
        assert PrfaasConnector.requires_piecewise_for_cudagraph(spec.extra) is (role != "pd-d")
    assert PrfaasConnector.requires_piecewise_for_cudagraph({"rate_gbps": 0.05}) is True
