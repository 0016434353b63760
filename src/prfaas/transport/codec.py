"""Lossless codecs for DATA frame payloads (topology `link: {compression: ...}`).

A compressed DATA frame carries, as its payload, `<I raw_bytes>` (little-endian u32: the bytes
of the tensor this chunk covers, from `chunk_offset`) followed by one lz4 block (`lz4.block`,
no size prefix) or one zstd frame (`zstandard`, level 1). Its header's `chunk_bytes` is that
payload's length on the wire, its payload CRC covers those wire bytes, and flag bits 1-2 name
the codec (wire.py). A sender compresses a chunk only when that makes it smaller, so a frame's
wire payload is always shorter than the tensor bytes it covers and the header's bounds checks
hold unchanged; a chunk that does not shrink travels raw, codec bits clear.

The receiver checks the wire CRC, then decompresses straight into the tensor's destination
(the arena slice of `[chunk_offset, chunk_offset + raw_bytes)`): a stream that does not
decode, or decodes to any other length than `raw_bytes`, is `BadPayload`.
`measure` times the codecs on a sample (what `compression: auto` decides from,
policy/compression.py). Compressor and decompressor contexts are per thread: the sender's and
receiver's connection threads run them in parallel (both libraries release the GIL).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable

import lz4.block
import zstandard

from prfaas.core.errors import ConfigError
from prfaas.policy.compression import CodecSpeed
from prfaas.transport.errors import BadPayload

CODECS = ("lz4", "zstd")
CODEC_ID = {"lz4": 1, "zstd": 2}  # the value of a DATA header's flag bits 1-2
CODEC_NAME = {v: k for k, v in CODEC_ID.items()}
ZSTD_LEVEL = 1
MIN_BYTES = 1024  # smaller chunks travel raw: a few bytes saved are not worth a frame's codec
_RAW = struct.Struct("<I")
PREFIX_BYTES = _RAW.size
_local = threading.local()


def codec_id(name: str) -> int:
    if name not in CODEC_ID:
        raise ConfigError("codec", name, f"unknown; known: {', '.join(CODECS)}")
    return CODEC_ID[name]


def _zstd_c() -> zstandard.ZstdCompressor:
    c = getattr(_local, "zc", None)
    if c is None:
        c = _local.zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _zstd_d() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def _pack(name: str, raw: memoryview) -> bytes:
    if name == "zstd":
        out: bytes = _zstd_c().compress(raw)
        return out
    packed: bytes = lz4.block.compress(raw, store_size=False)
    return packed


def compress(name: str, raw: memoryview | bytes) -> bytes | None:
    """The compressed payload of a chunk (prefix included), or None when it would not be
    smaller than the chunk itself (the chunk then travels raw)."""
    view = memoryview(raw).cast("B")
    if len(view) < MIN_BYTES:
        return None
    packed = _pack(name, view)
    if PREFIX_BYTES + len(packed) >= len(view):
        return None
    return _RAW.pack(len(view)) + packed


def raw_length(payload: memoryview | bytes) -> int:
    """The tensor bytes a compressed payload covers (its prefix)."""
    if len(payload) < PREFIX_BYTES:
        raise BadPayload(f"compressed payload of {len(payload)} bytes: shorter than its "
                         f"{PREFIX_BYTES}-byte length prefix")
    (n,) = _RAW.unpack(bytes(payload[:PREFIX_BYTES]))
    return int(n)


def decompress_into(ident: int, payload: memoryview | bytes, into: memoryview) -> None:
    """Decompress a compressed payload into `into`, which must be exactly its raw length."""
    name = CODEC_NAME.get(ident)
    if name is None:
        raise BadPayload(f"codec id {ident}: unknown")
    body = memoryview(payload)[PREFIX_BYTES:]
    try:
        got = _zstd_into(body, into) if name == "zstd" else _lz4_into(body, into)
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as exc:
        raise BadPayload(f"{name} payload does not decompress: {exc}") from exc
    if got != len(into):
        raise BadPayload(f"{name} payload decompresses to {got} bytes, its prefix says "
                         f"{len(into)}")


def _zstd_into(body: memoryview, into: memoryview) -> int:
    reader = _zstd_d().stream_reader(body, read_size=max(len(body), 1))
    got = 0
    while got < len(into):
        n = reader.readinto(into[got:])
        if n == 0:
            return got
        got += n
    if reader.read(1):  # more than declared: a length mismatch, not a truncation
        return got + 1
    return got


def _lz4_into(body: memoryview, into: memoryview) -> int:
    out = lz4.block.decompress(body, uncompressed_size=len(into))
    n = len(out)
    if n == len(into):
        into[:] = out
    return n


def measure(sample: memoryview | bytes | list[memoryview], codecs: tuple[str, ...] = CODECS,
            chunk_bytes: int = 2**20, repeats: int = 2) -> tuple[CodecSpeed, ...]:
    """Ratio and single-thread compress / decompress rates (uncompressed Gbps, best of
    `repeats`) of each codec on `sample` (one buffer or several tensors), each cut into
    `chunk_bytes` chunks as the sender cuts tensors; a chunk that would not shrink counts as
    sent raw, as the sender sends it."""
    parts = sample if isinstance(sample, list) else [sample]
    chunks = [v[i : i + chunk_bytes] for p in parts for v in [memoryview(p).cast("B")]
              for i in range(0, len(v), chunk_bytes)]
    raw = sum(len(c) for c in chunks)
    out = []
    for name in codecs:
        packed = [_pack(name, c) for c in chunks]
        dests = [memoryview(bytearray(len(c))) for c in chunks]
        ident = codec_id(name)
        framed = [_RAW.pack(len(c)) + p for c, p in zip(chunks, packed, strict=True)]
        comp_s = _best(repeats, _pack_all, name, chunks)
        dec_s = _best(repeats, _unpack_all, ident, framed, dests)
        wire = sum(min(PREFIX_BYTES + len(p), len(c))
                   for p, c in zip(packed, chunks, strict=True))
        out.append(CodecSpeed(name, raw / max(wire, 1), raw * 8 / comp_s / 1e9,
                              raw * 8 / dec_s / 1e9))
    return tuple(out)


def _pack_all(name: str, chunks: list[memoryview]) -> None:
    for c in chunks:
        _pack(name, c)


def _unpack_all(ident: int, framed: list[bytes], dests: list[memoryview]) -> None:
    for f, d in zip(framed, dests, strict=True):
        decompress_into(ident, f, d)


def _best(repeats: int, fn: Callable[..., None], *args: object) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)
