"""The KV wire format (version 2): a fixed 116-byte little-endian header, then raw payload bytes.

Every frame is `HEADER` followed by `chunk_bytes` of payload. DATA frames carry one chunk of one
tensor (a tensor larger than a chunk is split into several frames, possibly on different
connections); END frames carry an `EndInfo` payload (totals, then an opaque manifest the layer
above binds the transfer with); ABORT frames carry a UTF-8 reason. The header checksum is
CRC-32C (Castagnoli, the SSE4.2 instruction); the payload one is CRC-32 (zlib's polynomial,
computed by ISA-L with AVX-512 carry-less multiply folding, twice the CRC-32C loop's speed; see
`payload_checksum`) and is present when flag `PAYLOAD_CHECKSUM` is set, which a sender over TLS
leaves off (the TLS record's AEAD tag already authenticates every byte).
The byte table lives in docs/wire-format.md. Nothing here touches sockets: `decode_header`
validates every field against `Limits` and raises a typed `TransportError` naming the bad value.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import TypeVar

import crc32c
import numpy as np
from isal import isal_zlib

from prfaas.transport.errors import BadHeader, BadMagic, BadShape, ChecksumMismatch, FrameTooLarge

MAGIC = b"PKV1"
VERSION = 3  # 3: payload checksum CRC-32 (ISA-L), was CRC-32C
MAX_NDIM = 6
NAME_BYTES = 16
PAYLOAD_CHECKSUM = 0x01  # flags bit: payload_crc holds the payload's CRC-32
# flags bits 1-2 of a DATA frame: the payload's codec (0 raw, 1 lz4, 2 zstd; transport/codec.py)
CODEC_SHIFT = 1
CODEC_MASK = 0x06
_CODEC_IDS = (1, 2)
# magic, version, frame type, kind, dtype, request id, layer, ndim, flags, (2 pad), name,
# shape[6], total bytes, chunk offset, chunk bytes, payload crc; the header crc follows.
_BODY = struct.Struct("<4sBBBBQIBB2x16s6QQQII")
_CRC = struct.Struct("<I")
HEADER_BYTES = _BODY.size + _CRC.size  # 116
# tensors, tensor bytes, streams, this stream's index, manifest bytes (the manifest follows)
_END = struct.Struct("<QQIII")


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of `data` (SSE4.2 instruction where the CPU has it)."""
    value: int = crc32c.crc32c(data)
    return value


def payload_checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 of a payload (zlib's value), by ISA-L: folding with VPCLMULQDQ where the CPU has
    it, about 2x the CRC-32C instruction loop, GIL released. Issue 23's profile: on a loopback
    at 30-40 Gbps each side's CRC-32C pass cost 40% of that side's kernel copy."""
    value: int = isal_zlib.crc32(data)
    return value

_E = TypeVar("_E", bound=IntEnum)


class FrameType(IntEnum):
    DATA = 1
    END = 2
    ABORT = 3


class Kind(IntEnum):
    """Attention kind of the layer a tensor belongs to (NONE for request-level data)."""

    NONE = 0
    MLA = 1
    GQA = 2
    SWA = 3
    LINEAR = 4


class DType(IntEnum):
    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3  # raw 2-byte words; numpy has no bf16, so it travels as uint16
    INT32 = 4
    INT64 = 5
    UINT8 = 6


_NUMPY_OF: dict[DType, np.dtype] = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.BFLOAT16: np.dtype("<u2"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
    DType.UINT8: np.dtype("u1"),
}
_CODE_OF: dict[str, DType] = {
    "float32": DType.FLOAT32,
    "float16": DType.FLOAT16,
    "int32": DType.INT32,
    "int64": DType.INT64,
    "uint8": DType.UINT8,
}


def numpy_dtype(code: DType) -> np.dtype:
    return _NUMPY_OF[code]


def dtype_code(array: np.ndarray, bfloat16: bool = False) -> DType:
    """Wire dtype of `array`; `bfloat16=True` marks a uint16 array holding bf16 words."""
    if bfloat16:
        if array.dtype.itemsize != 2:
            raise BadShape(f"dtype={array.dtype}: bfloat16 payloads must be 2-byte words")
        return DType.BFLOAT16
    code = _CODE_OF.get(array.dtype.name)
    if code is None:
        known = ", ".join([*_CODE_OF, "bfloat16"])
        raise BadShape(f"dtype={array.dtype}: not sendable; known: {known}")
    return code


def kind_code(kind: str | Kind) -> Kind:
    if isinstance(kind, Kind):
        return kind
    try:
        return Kind[kind.upper()]
    except KeyError:
        raise BadHeader(f"kind={kind!r}: unknown; known: mla, gqa, swa, linear, none") from None


@dataclass(frozen=True, slots=True)
class Limits:
    """What a receiver accepts; anything beyond is refused before memory is allocated."""

    max_chunk_bytes: int = 64 * 2**20
    max_tensor_bytes: int = 8 * 2**30
    max_abort_bytes: int = 4096
    max_manifest_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class FrameHeader:
    frame_type: FrameType
    request_id: int
    layer: int
    kind: Kind
    name: str
    dtype: DType
    shape: tuple[int, ...]
    total_bytes: int
    chunk_offset: int
    chunk_bytes: int
    payload_crc: int
    flags: int = PAYLOAD_CHECKSUM

    @property
    def payload_checksummed(self) -> bool:
        return bool(self.flags & PAYLOAD_CHECKSUM)

    @property
    def codec(self) -> int:
        """0: the payload is the tensor's bytes; else the codec id its payload is packed with
        (transport/codec.py: a length prefix, then the codec's output)."""
        return (self.flags & CODEC_MASK) >> CODEC_SHIFT


@dataclass(frozen=True, slots=True)
class EndInfo:
    """END payload: what the whole request carried, which of the sender's streams this is, and
    the manifest (opaque bytes here; serve/worker/manifest.py gives them meaning; stream 0 only)."""

    num_tensors: int
    tensor_bytes: int
    num_streams: int
    stream_index: int
    manifest: bytes = b""


def encode_header(h: FrameHeader, payload_crc: int | None = None) -> bytes:
    """`payload_crc` (when given) replaces `h.payload_crc`."""
    name = h.name.encode()
    if len(name) > NAME_BYTES:
        raise BadShape(f"name={h.name!r}: longer than {NAME_BYTES} UTF-8 bytes")
    if len(h.shape) > MAX_NDIM:
        raise BadShape(f"shape={h.shape}: more than {MAX_NDIM} dimensions")
    shape6 = (*h.shape, *([0] * (MAX_NDIM - len(h.shape))))
    body = _BODY.pack(
        MAGIC, VERSION, h.frame_type, h.kind, h.dtype, h.request_id, h.layer, len(h.shape),
        h.flags, name, *shape6, h.total_bytes, h.chunk_offset, h.chunk_bytes,
        h.payload_crc if payload_crc is None else payload_crc,
    )
    return body + _CRC.pack(checksum(body))


def decode_header(raw: bytes | bytearray | memoryview, limits: Limits) -> FrameHeader:
    """Parse and validate one header; raises BadMagic, ChecksumMismatch, BadHeader, BadShape or
    FrameTooLarge naming the offending field."""
    body = bytes(raw[: _BODY.size])
    fields = _BODY.unpack(body)
    magic, version, ftype, kind, dtype, rid, layer, ndim, flags, name_raw = fields[:10]
    shape6, (total, offset, chunk, pcrc) = fields[10:16], fields[16:]
    if magic != MAGIC:
        raise BadMagic(f"magic={magic!r}: expected {MAGIC!r}")
    if version != VERSION:
        raise BadMagic(f"version={version}: this receiver speaks version {VERSION}")
    (want_crc,) = _CRC.unpack(bytes(raw[_BODY.size : HEADER_BYTES]))
    if checksum(body) != want_crc:
        raise ChecksumMismatch(f"header crc32c={want_crc:#010x}: computed {checksum(body):#010x}")
    if flags & ~(PAYLOAD_CHECKSUM | CODEC_MASK):
        raise BadHeader(f"flags={flags:#04x}: unknown bits")
    codec = (flags & CODEC_MASK) >> CODEC_SHIFT
    if codec and (codec not in _CODEC_IDS or ftype != FrameType.DATA):
        raise BadHeader(f"flags={flags:#04x}: codec {codec} unknown or on a non-DATA frame")
    h = FrameHeader(
        frame_type=_enum(FrameType, ftype, "frame_type"),
        request_id=rid,
        layer=layer,
        kind=_enum(Kind, kind, "kind"),
        name=_decode_name(name_raw),
        dtype=_enum(DType, dtype, "dtype"),
        shape=_shape(ndim, shape6),
        total_bytes=total,
        chunk_offset=offset,
        chunk_bytes=chunk,
        payload_crc=pcrc,
        flags=flags,
    )
    _check_lengths(h, limits)
    return h


def _enum(cls: type[_E], value: int, field: str) -> _E:
    try:
        return cls(value)
    except ValueError:
        raise BadHeader(f"{field}={value}: unknown code") from None


def _decode_name(raw: bytes) -> str:
    try:
        return raw.rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise BadHeader(f"name={raw!r}: not UTF-8") from None


def _shape(ndim: int, shape6: tuple[int, ...]) -> tuple[int, ...]:
    if ndim > MAX_NDIM:
        raise BadShape(f"ndim={ndim}: more than {MAX_NDIM}")
    if any(shape6[ndim:]):
        raise BadShape(f"shape={shape6}: nonzero dims beyond ndim={ndim}")
    return tuple(shape6[:ndim])


def _check_lengths(h: FrameHeader, limits: Limits) -> None:
    if h.frame_type == FrameType.ABORT:
        if h.chunk_bytes > limits.max_abort_bytes:
            raise FrameTooLarge(f"abort reason chunk_bytes={h.chunk_bytes}: limit "
                                f"{limits.max_abort_bytes}")
        return
    if h.chunk_bytes > limits.max_chunk_bytes:
        raise FrameTooLarge(f"chunk_bytes={h.chunk_bytes}: limit {limits.max_chunk_bytes}")
    if h.total_bytes > limits.max_tensor_bytes:
        raise FrameTooLarge(f"total_bytes={h.total_bytes}: limit {limits.max_tensor_bytes}")
    want = math.prod(h.shape) * _NUMPY_OF[h.dtype].itemsize
    if want != h.total_bytes:
        raise BadShape(f"shape={h.shape} dtype={h.dtype.name} is {want} bytes, "
                       f"header says total_bytes={h.total_bytes}")
    if h.chunk_offset + h.chunk_bytes > h.total_bytes:
        raise BadShape(f"chunk [{h.chunk_offset}, +{h.chunk_bytes}) beyond "
                       f"total_bytes={h.total_bytes}")
    if h.chunk_bytes == 0 and h.total_bytes > 0:
        raise BadShape("chunk_bytes=0 in a non-empty tensor")
    if h.codec and h.chunk_bytes <= 4:
        raise BadShape(f"compressed chunk_bytes={h.chunk_bytes}: no room for its length prefix")
    if h.frame_type == FrameType.END and not (
            _END.size <= h.total_bytes <= _END.size + limits.max_manifest_bytes):
        raise BadShape(f"END payload total_bytes={h.total_bytes}: expected {_END.size} plus a "
                       f"manifest of at most {limits.max_manifest_bytes} bytes")


def data_header(request_id: int, layer: int, kind: Kind, name: str, dtype: DType,
                shape: tuple[int, ...], total_bytes: int, chunk_offset: int,
                payload: memoryview, with_checksum: bool = True) -> bytes:
    """`with_checksum=False` (senders over TLS): no payload CRC, flag cleared."""
    return encode_header(FrameHeader(
        FrameType.DATA, request_id, layer, kind, name, dtype, shape, total_bytes,
        chunk_offset, len(payload), payload_checksum(payload) if with_checksum else 0,
        PAYLOAD_CHECKSUM if with_checksum else 0,
    ))


def data_header_unsealed(request_id: int, layer: int, kind: Kind, name: str, dtype: DType,
                         shape: tuple[int, ...], total_bytes: int, chunk_offset: int,
                         chunk_bytes: int, with_checksum: bool = True) -> FrameHeader:
    """A DATA header whose payload CRC `seal_header` computes later (in the sending thread)."""
    return FrameHeader(FrameType.DATA, request_id, layer, kind, name, dtype, shape, total_bytes,
                       chunk_offset, chunk_bytes, 0, PAYLOAD_CHECKSUM if with_checksum else 0)


def packed_header(h: FrameHeader, codec: int, wire_bytes: int) -> FrameHeader:
    """A DATA header for the same chunk carried compressed: `wire_bytes` of payload."""
    return replace(h, chunk_bytes=wire_bytes,
                   flags=(h.flags & ~CODEC_MASK) | (codec << CODEC_SHIFT))


def inflated_header(h: FrameHeader, raw_bytes: int, limits: Limits) -> FrameHeader:
    """The header of a compressed chunk as the tensor sees it: `raw_bytes` of tensor from
    `chunk_offset`, codec bits clear; validated like any header (BadShape, FrameTooLarge)."""
    out = replace(h, chunk_bytes=raw_bytes, flags=h.flags & ~CODEC_MASK)
    _check_lengths(out, limits)
    return out


def seal_header(h: FrameHeader, payload: bytes | memoryview) -> bytes:
    """The encoded header, with the payload's CRC when the header asks for one."""
    crc = payload_checksum(payload) if h.payload_checksummed else 0
    return encode_header(h, crc)  # (not dataclasses.replace: a frame's worth of Python)


def _small_frame(ftype: FrameType, request_id: int, payload: bytes) -> bytes:
    header = encode_header(FrameHeader(
        ftype, request_id, 0, Kind.NONE, "", DType.UINT8, (len(payload),),
        len(payload), 0, len(payload), payload_checksum(payload),
    ))
    return header + payload


def end_frame(request_id: int, info: EndInfo) -> bytes:
    fixed = _END.pack(info.num_tensors, info.tensor_bytes, info.num_streams, info.stream_index,
                      len(info.manifest))
    return _small_frame(FrameType.END, request_id, fixed + info.manifest)


def decode_end(payload: bytes | bytearray | memoryview) -> EndInfo:
    raw = bytes(payload)
    tensors, tensor_bytes, streams, index, manifest_bytes = _END.unpack(raw[: _END.size])
    if streams == 0 or index >= streams:
        raise BadShape(f"END stream_index={index} of num_streams={streams}")
    if manifest_bytes != len(raw) - _END.size:
        raise BadShape(f"END manifest_bytes={manifest_bytes}: payload has "
                       f"{len(raw) - _END.size} after the totals")
    return EndInfo(tensors, tensor_bytes, streams, index, raw[_END.size :])


def abort_frame(request_id: int, reason: str) -> bytes:
    return _small_frame(FrameType.ABORT, request_id, reason.encode()[:4096])


def trusted_request_id(raw: bytes | bytearray | memoryview) -> int | None:
    """The request id of a header whose magic, version and crc are good (even if other fields
    are not), so a receiver can fail that request; None when the header cannot be trusted."""
    body = bytes(raw[: _BODY.size])
    if len(raw) < HEADER_BYTES or body[:4] != MAGIC or body[4] != VERSION:
        return None
    (want_crc,) = _CRC.unpack(bytes(raw[_BODY.size : HEADER_BYTES]))
    if checksum(body) != want_crc:
        return None
    request_id: int = _BODY.unpack(body)[5]
    return request_id
