"""Lossless compression on the wire (transport/codec.py): tensors arrive bit-exact whatever the
codec, the wire carries fewer bytes when the KV compresses, a corrupted compressed frame is
refused (with the intact frame as control), and `auto` decides from codecs it timed itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import numpy as np
import pytest
import torch

from prfaas.core.errors import ConfigError, TransportError
from prfaas.transport import KVReceiver, KVSender, ReceiverConfig, SenderConfig
from prfaas.transport import codec as codecs
from prfaas.transport.errors import BadHeader, BadPayload, ChecksumMismatch
from prfaas.transport.wire import (
    DType,
    EndInfo,
    Kind,
    Limits,
    data_header_unsealed,
    decode_header,
    end_frame,
    packed_header,
    seal_header,
)

RID = 31


def run(coro: Awaitable[None], timeout_s: float = 30.0) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout_s))


def _bf16_words(n: int, seed: int) -> np.ndarray:
    """KV-like bf16 words (normal values): zstd shrinks them ~1.25x, lz4 does not."""
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32))
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _tensors(seed: int) -> list[tuple[int, str, str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    sparse = np.zeros((64, 512), np.float32)  # lz4 shrinks runs of zeros
    sparse[::7] = rng.standard_normal((10, 512))
    return [
        (0, "linear", "state", rng.standard_normal((4, 16, 16)).astype(np.float32)),
        (1, "mla", "latent", _bf16_words(300 * 512, seed).reshape(300, 512)),
        (1, "mla", "sparse", sparse),
        (2, "gqa", "tiny", np.arange(7, dtype=np.int32)),  # below codec.MIN_BYTES: raw
        (2, "gqa", "empty", np.zeros((0, 4), np.float32)),
    ]


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_compressed_transfer_is_bit_exact_and_ships_fewer_bytes(codec: str) -> None:
    async def body() -> None:
        async with KVReceiver() as rx:
            cfg = SenderConfig(num_connections=3, chunk_bytes=64 * 1024, compression=codec)
            async with KVSender("127.0.0.1", rx.port, cfg) as tx:
                wire = await _send(tx, RID)
                kv = await rx.wait_request(RID, timeout_s=10)
                stats = tx.stats()
        raw = 0
        for layer, kind, name, a in _tensors(RID):
            assert np.array_equal(kv.layers[layer][name], a) and kv.kinds[layer] == kind
            raw += a.nbytes
        assert kv.num_bytes == raw  # the receiver counts tensor bytes, not wire bytes
        assert stats.codec == codec and rx.stats.compressed_frames == stats.compressed_frames
        assert stats.sent_bytes == rx.stats.received_bytes  # both count wire bytes
        if codec == "none":  # control: nothing packed, wire = tensor bytes
            assert stats.compressed_frames == 0 and wire == raw
        else:
            assert stats.compressed_frames > 0 and wire < raw
            assert rx.stats.decompressed_bytes > wire - (raw - rx.stats.decompressed_bytes)
        if codec == "zstd":  # bf16 KV words shrink under zstd (~1.25x), not under lz4
            assert wire < 0.9 * raw

    run(body())


async def _send(tx: KVSender, rid: int) -> int:
    for layer, kind, name, a in _tensors(rid):
        await tx.send_array(rid, layer, kind, name, a, bfloat16=name == "latent")
    return await tx.finish(rid)


def _compressed_frame(payload_bytes: bytes, corrupt: str = "") -> tuple[bytes, np.ndarray]:
    """One DATA frame carrying a whole 64 KiB bf16 tensor zstd-compressed, and that tensor.
    `corrupt`: "wire" flips a payload byte after the CRC was computed (what the link does);
    "stream" cuts the stream's tail before the CRC is computed (a CRC that matches a stream
    that does not decode to its length); "length" lies in the prefix."""
    a = _bf16_words(32 * 1024, 3)
    raw = a.view(np.uint8).data
    packed = bytearray(codecs.compress("zstd", raw) or b"")
    assert packed and len(packed) < len(raw)
    if corrupt == "stream":
        del packed[-64:]
    if corrupt == "length":
        packed[:4] = (len(raw) - 2).to_bytes(4, "little")
    h = data_header_unsealed(RID, 0, Kind.MLA, "latent", DType.BFLOAT16, a.shape, len(raw), 0,
                             len(raw))
    h = packed_header(h, codecs.codec_id("zstd"), len(packed))
    frame = bytearray(seal_header(h, bytes(packed)) + bytes(packed))
    if corrupt == "wire":
        frame[-100] ^= 0x01
    end = end_frame(RID, EndInfo(1, len(raw), 1, 0))
    return bytes(frame) + payload_bytes + end, a


@pytest.mark.parametrize(("corrupt", "error", "message"), [
    ("", None, ""),  # control: the same frame intact is accepted and decodes to the tensor
    ("wire", ChecksumMismatch, "payload crc32 "),
    ("stream", BadPayload, r"zstd payload decompresses to \d+ bytes, its prefix says 65536"),
    ("length", BadPayload, "decompresses to more than|prefix says"),
])
def test_corrupted_compressed_frame_is_refused(corrupt: str, error: type[TransportError] | None,
                                               message: str) -> None:
    async def body() -> None:
        async with KVReceiver(ReceiverConfig(frame_timeout_s=2.0)) as rx:
            waiter = asyncio.create_task(rx.wait_request(RID, timeout_s=10))
            frame, a = _compressed_frame(b"", corrupt)
            _, writer = await asyncio.open_connection("127.0.0.1", rx.port)
            writer.write(frame)
            await writer.drain()
            if error is None:
                kv = await waiter
                assert np.array_equal(kv.layers[0]["latent"], a)
                assert kv.bfloat16 == {(0, "latent")} and rx.stats.compressed_frames == 1
            else:
                with pytest.raises(error, match=message):
                    await waiter
            writer.close()

    run(body())


def test_header_codec_bits_are_checked() -> None:
    h = data_header_unsealed(RID, 0, Kind.MLA, "x", DType.UINT8, (4096,), 4096, 0, 4096)
    sealed = seal_header(packed_header(h, 3, 100), b"\0" * 100)  # codec 3 does not exist
    with pytest.raises(BadHeader, match="codec 3 unknown"):
        decode_header(sealed, Limits())
    good = decode_header(seal_header(packed_header(h, 2, 100), b"\0" * 100), Limits())
    assert good.codec == 2 and good.chunk_bytes == 100 and good.total_bytes == 4096


@pytest.mark.parametrize(("link_rate_gbps", "expected"), [
    (0.05, "zstd"),  # a slow link: any codec beats 12.5 Mbps per connection
    (400.0, "none"),  # 100 Gbps per connection: faster than either codec on one core
    (None, "none"),  # unshaped: taken as faster than any codec
])
def test_auto_measures_the_codecs_on_the_first_big_tensor(link_rate_gbps: float | None,
                                                          expected: str) -> None:
    async def body() -> None:
        async with KVReceiver() as rx:
            cfg = SenderConfig(num_connections=4, compression="auto",
                               link_rate_gbps=link_rate_gbps)
            async with KVSender("127.0.0.1", rx.port, cfg) as tx:
                assert tx.codec is None  # undecided until a tensor worth measuring on
                await _send(tx, RID)
                kv = await rx.wait_request(RID, timeout_s=10)
                assert tx.codec == expected and tx.stats().codec == expected
                assert {s.name for s in tx.codec_speeds} == {"lz4", "zstd"}
                zstd = next(s for s in tx.codec_speeds if s.name == "zstd")
                assert zstd.ratio > 1.0 and zstd.compress_gbps > 0
                assert (rx.stats.compressed_frames > 0) == (expected != "none")
        for layer, _k, name, a in _tensors(RID):
            assert np.array_equal(kv.layers[layer][name], a)

    run(body())


def test_bad_compression_mode_is_one_line_error() -> None:
    with pytest.raises(ConfigError, match="compression='brotli': must be one of"):
        SenderConfig(compression="brotli")


def test_auto_gathers_small_tensors_until_it_has_enough_to_measure() -> None:
    small = [_bf16_words(16 * 1024, s) for s in range(12)]  # 32 KiB each, 384 KiB in all

    async def body() -> None:
        async with KVReceiver() as rx:
            cfg = SenderConfig(num_connections=2, compression="auto", link_rate_gbps=0.05)
            async with KVSender("127.0.0.1", rx.port, cfg) as tx:
                for i, a in enumerate(small):
                    await tx.send_array(RID, i, "mla", "kv", a, bfloat16=True)
                    # undecided below 256 KiB of KV (the 8th tensor reaches it), then zstd
                    assert tx.codec == (None if i < 7 else "zstd"), i
                await tx.finish(RID)
                kv = await rx.wait_request(RID, timeout_s=10)
                # the 8th tensor completes the sample and already travels compressed
                assert rx.stats.compressed_frames == len(small) - 7
        for i, a in enumerate(small):
            assert np.array_equal(kv.layers[i]["kv"], a)

    run(body())
