"""Bad input on the wire: each fault gives a typed error naming what was wrong to the request's
waiter, the receiver closes that connection, and it keeps serving other transfers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from prfaas.core.errors import TransportError
from prfaas.transport import (
    BadMagic,
    BadShape,
    ChecksumMismatch,
    FrameTooLarge,
    KVReceiver,
    KVSender,
    PeerGone,
    ReceiverConfig,
    SenderConfig,
    ShortRead,
    TransferTimeout,
)
from prfaas.transport.wire import (
    DType,
    FrameHeader,
    FrameType,
    Kind,
    Limits,
    data_header,
    encode_header,
    payload_checksum,
)

RID = 21
PAYLOAD = bytes(range(256)) * 4  # 1024 bytes: chunk 0 of a 2048-byte tensor


def _chunk(offset: int = 0, payload: bytes = PAYLOAD) -> bytes:
    return data_header(RID, 3, Kind.MLA, "kv", DType.UINT8, (2048,), 2048, offset,
                       memoryview(payload)) + payload


def _header(**over: object) -> bytes:
    fields: dict[str, object] = dict(
        frame_type=FrameType.DATA, request_id=RID, layer=3, kind=Kind.MLA, name="kv",
        dtype=DType.UINT8, shape=(2048,), total_bytes=2048, chunk_offset=1024, chunk_bytes=1024,
        payload_crc=payload_checksum(PAYLOAD),
    )
    fields.update(over)
    return encode_header(FrameHeader(**fields))  # type: ignore[arg-type,unused-ignore]


def _corrupt_payload() -> bytes:
    frame = bytearray(_chunk(1024))
    frame[-1] ^= 0xFF
    return bytes(frame)


# name -> (bytes the attacker sends, does it hang up itself, expected error, message)
CASES: dict[str, tuple[Callable[[], bytes], bool, type[TransportError], str]] = {
    "wrong_magic": (lambda: _chunk() + b"XXXX" + _header()[4:], False, BadMagic,
                    "magic=b'XXXX'"),
    "bad_checksum": (lambda: _chunk() + _corrupt_payload(), False, ChecksumMismatch,
                     "payload crc32 "),
    "short_read": (lambda: _chunk() + _chunk(1024)[:-500], True, ShortRead,
                   "after 524 of 1024 bytes"),
    "peer_gone": (lambda: _chunk(), True, PeerGone, r"request\(s\) \[21\] in flight"),
    "absurd_shape": (lambda: _chunk() + _header(shape=(7, 3)), False, BadShape,
                     r"shape=\(7, 3\) dtype=UINT8 is 21 bytes"),
    "absurd_length": (lambda: _chunk() + _header(shape=(2**40,), total_bytes=2**40),
                      False, FrameTooLarge, "total_bytes=1099511627776"),
    "absurd_chunk": (lambda: _header(chunk_bytes=2**31), False, FrameTooLarge,
                     "chunk_bytes=2147483648"),
    "stalled_mid_frame": (lambda: _chunk() + _chunk(1024)[:300], False, TransferTimeout,
                          "payload of request 21 layer 3"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_frame_fails_its_request_closes_connection_and_server_keeps_serving(
        case: str) -> None:
    make, hang_up, error, message = CASES[case]

    async def body() -> None:
        cfg = ReceiverConfig(frame_timeout_s=0.5, limits=Limits(max_chunk_bytes=1 << 20,
                                                                max_tensor_bytes=1 << 30))
        async with KVReceiver(cfg) as rx:
            waiter = asyncio.create_task(rx.wait_request(RID, timeout_s=5))
            reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
            writer.write(make())
            await writer.drain()
            if hang_up:
                writer.close()
            else:  # the receiver must close it from its side: we read EOF, no hang
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            with pytest.raises(error, match=message):
                await waiter
            assert type(rx.errors[-1]) is error and rx.stats.connections_failed == 1
            async with KVSender("127.0.0.1", rx.port, SenderConfig(num_connections=2)) as tx:
                good = np.arange(5000, dtype=np.int32)
                await tx.send_array(RID + 1, 0, "gqa", "k", good)
                await tx.finish(RID + 1)
                kv = await rx.wait_request(RID + 1, timeout_s=5)
            assert np.array_equal(kv.layers[0]["k"], good)

    asyncio.run(asyncio.wait_for(body(), 15))


def test_inconsistent_end_fails_only_that_request() -> None:
    """END announcing more tensors than arrived: ShortRead for the request, link stays up."""

    async def body() -> None:
        async with KVReceiver() as rx:
            async with KVSender("127.0.0.1", rx.port, SenderConfig(num_connections=1)) as tx:
                await tx.send_array(31, 0, "gqa", "k", np.ones(10, np.float32))
                tx._requests[31].num_tensors += 1  # a buggy sender's END
                await tx.finish(31)
                with pytest.raises(ShortRead, match="announced 2 tensors / 40 bytes, got 1"):
                    await rx.wait_request(31, timeout_s=5)
                await tx.send_array(32, 0, "gqa", "k", np.ones(10, np.float32))
                await tx.finish(32)
                assert (await rx.wait_request(32, timeout_s=5)).num_bytes == 40
            assert rx.errors == []

    asyncio.run(asyncio.wait_for(body(), 15))
