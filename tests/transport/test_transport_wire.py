"""Wire format: header round trip and every validation error, without sockets."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from prfaas.transport.errors import BadHeader, BadMagic, BadShape, ChecksumMismatch, FrameTooLarge
from prfaas.transport.wire import (
    HEADER_BYTES,
    DType,
    EndInfo,
    FrameHeader,
    FrameType,
    Kind,
    Limits,
    checksum,
    decode_end,
    decode_header,
    dtype_code,
    encode_header,
    end_frame,
    kind_code,
    payload_checksum,
    trusted_request_id,
)

LIMITS = Limits(max_chunk_bytes=1 << 20, max_tensor_bytes=1 << 24)


def _header(**over: object) -> FrameHeader:
    fields: dict[str, object] = dict(
        frame_type=FrameType.DATA, request_id=2**40 + 3, layer=7, kind=Kind.MLA, name="kv_c",
        dtype=DType.FLOAT16, shape=(3, 5), total_bytes=30, chunk_offset=10, chunk_bytes=20,
        payload_crc=0xDEADBEEF,
    )
    fields.update(over)
    return FrameHeader(**fields)  # type: ignore[arg-type,unused-ignore]


def _reseal(raw: bytes) -> bytes:
    """Recompute the header crc so a test reaches the checks behind it."""
    return raw[:-4] + struct.pack("<I", checksum(raw[:-4]))


def test_header_round_trip_keeps_every_field() -> None:
    h = _header()
    raw = encode_header(h)
    assert len(raw) == HEADER_BYTES == 116
    assert raw[:4] == b"PKV1"
    assert raw[4] == 3  # version
    assert decode_header(raw, LIMITS) == h


def test_wrong_magic_and_version_are_bad_magic() -> None:
    raw = encode_header(_header())
    with pytest.raises(BadMagic, match="magic=b'XKV1'"):
        decode_header(b"XKV1" + raw[4:], LIMITS)
    with pytest.raises(BadMagic, match="version=9"):
        decode_header(raw[:4] + b"\x09" + raw[5:], LIMITS)


def test_flipped_header_bit_is_a_checksum_mismatch() -> None:
    raw = bytearray(encode_header(_header()))
    raw[20] ^= 0x01
    with pytest.raises(ChecksumMismatch, match="header crc32c"):
        decode_header(bytes(raw), LIMITS)


@pytest.mark.parametrize(
    ("over", "error", "message"),
    [
        ({"shape": (3, 6)}, BadShape, r"shape=\(3, 6\) dtype=FLOAT16 is 36 bytes"),
        ({"chunk_offset": 20}, BadShape, "beyond total_bytes=30"),
        ({"chunk_bytes": 0}, BadShape, "chunk_bytes=0"),
        ({"shape": (1 << 30,), "total_bytes": 1 << 31, "chunk_offset": 0}, FrameTooLarge,
         "total_bytes=2147483648"),
        ({"shape": (1 << 21,), "total_bytes": 1 << 22, "chunk_offset": 0,
          "chunk_bytes": (1 << 20) + 1}, FrameTooLarge, "chunk_bytes=1048577"),
    ],
)
def test_absurd_lengths_and_shapes_are_refused(over: dict[str, object], error: type[Exception],
                                               message: str) -> None:
    with pytest.raises(error, match=message):
        decode_header(encode_header(_header(**over)), LIMITS)


def test_unknown_codes_and_too_many_dims_are_named() -> None:
    raw = encode_header(_header())
    with pytest.raises(BadHeader, match="dtype=99"):
        decode_header(_reseal(raw[:7] + b"\x63" + raw[8:]), LIMITS)
    with pytest.raises(BadHeader, match="frame_type=7"):
        decode_header(_reseal(raw[:5] + b"\x07" + raw[6:]), LIMITS)
    with pytest.raises(BadShape, match="ndim=9"):
        decode_header(_reseal(raw[:20] + b"\x09" + raw[21:]), LIMITS)


def test_trusted_request_id_only_for_sound_headers() -> None:
    raw = encode_header(_header(shape=(999,)))  # bad shape, sound framing
    assert trusted_request_id(raw) == 2**40 + 3
    assert trusted_request_id(b"XKV1" + raw[4:]) is None
    assert trusted_request_id(raw[:-1] + bytes([raw[-1] ^ 1])) is None


def test_end_frame_payload_round_trip_and_bad_stream_index() -> None:
    frame = end_frame(5, EndInfo(12, 4096, 4, 3))
    h = decode_header(frame[:HEADER_BYTES], LIMITS)
    assert (h.frame_type, h.request_id, h.chunk_bytes) == (FrameType.END, 5, 28)
    assert decode_end(frame[HEADER_BYTES:]) == EndInfo(12, 4096, 4, 3)
    with pytest.raises(BadShape, match="stream_index=4 of num_streams=4"):
        decode_end(struct.pack("<QQIII", 1, 1, 4, 4, 0))


def test_end_frame_carries_a_manifest_and_checks_its_length() -> None:
    frame = end_frame(5, EndInfo(1, 8, 2, 0, b'{"m": 1}'))
    h = decode_header(frame[:HEADER_BYTES], LIMITS)
    assert h.chunk_bytes == 28 + 8
    assert decode_end(frame[HEADER_BYTES:]).manifest == b'{"m": 1}'
    with pytest.raises(BadShape, match="manifest_bytes=9"):
        decode_end(struct.pack("<QQIII", 1, 8, 2, 0, 9) + b'{"m": 1}')
    big = _header(frame_type=FrameType.END, dtype=DType.UINT8, shape=(2 << 20,),
                  total_bytes=2 << 20, chunk_offset=0, chunk_bytes=2 << 20)
    with pytest.raises(BadShape, match="manifest of at most"):
        decode_header(encode_header(big), Limits(max_chunk_bytes=4 << 20))


def test_payload_checksum_flag_round_trips_and_unknown_flags_are_refused() -> None:
    h = _header(flags=0, payload_crc=0)
    assert not decode_header(encode_header(h), LIMITS).payload_checksummed
    assert decode_header(encode_header(_header()), LIMITS).payload_checksummed
    raw = encode_header(_header())
    with pytest.raises(BadHeader, match="flags=0x81"):
        decode_header(_reseal(raw[:21] + b"\x81" + raw[22:]), LIMITS)


def test_dtype_and_kind_codes() -> None:
    assert dtype_code(np.zeros(2, np.float32)) == DType.FLOAT32
    assert dtype_code(np.zeros(2, np.uint16), bfloat16=True) == DType.BFLOAT16
    with pytest.raises(BadShape, match="complex128"):
        dtype_code(np.zeros(2, np.complex128))
    with pytest.raises(BadShape, match="2-byte"):
        dtype_code(np.zeros(2, np.float32), bfloat16=True)
    assert kind_code("linear") == Kind.LINEAR
    with pytest.raises(BadHeader, match="kind='dense'"):
        kind_code("dense")


def test_payload_checksum_is_crc32_and_header_checksum_crc32c() -> None:
    """docs/wire-format.md names the two algorithms: the payload's is zlib's CRC-32 (here
    computed by ISA-L, checked against zlib's own code), the header's CRC-32C (the iSCSI
    check value of "123456789" is 0xE3069283; CRC-32's is 0xCBF43926)."""
    data = np.random.default_rng(9).integers(0, 256, 3 * 2**20 + 7, dtype=np.uint8)
    for view in (data.data, data[5:].data, memoryview(b"")):
        assert payload_checksum(view) == zlib.crc32(view)
    assert payload_checksum(b"123456789") == 0xCBF43926
    assert checksum(b"123456789") == 0xE3069283
    flipped = data.copy()
    flipped[2**20] ^= 0x10
    assert payload_checksum(flipped.data) != payload_checksum(data.data)
