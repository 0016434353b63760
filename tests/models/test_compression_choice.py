"""`auto` compresses only when the codec moves more uncompressed bytes per connection than the
connection's share of the link does without it."""

from __future__ import annotations

import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.compression import CodecSpeed, choose_compression

LZ4 = CodecSpeed("lz4", ratio=1.1, compress_gbps=8.0, decompress_gbps=24.0)
ZSTD = CodecSpeed("zstd", ratio=1.4, compress_gbps=2.0, decompress_gbps=6.0)


def test_slow_link_takes_the_codec_with_the_best_rate() -> None:
    # 0.4 Gbps over 4 connections: share 0.1; zstd moves 0.14, lz4 0.11
    assert choose_compression("auto", 0.4, 4, (LZ4, ZSTD)) == "zstd"


def test_mid_link_prefers_the_faster_codec() -> None:
    # share 4: zstd is capped by its 2 Gbps compressor, lz4 moves 4.4
    assert choose_compression("auto", 16.0, 4, (LZ4, ZSTD)) == "lz4"


def test_fast_or_unshaped_link_sends_raw() -> None:
    # share 10: lz4 compresses at 8 < 10, zstd at 2 < 10: compressing would slow the link down
    assert choose_compression("auto", 40.0, 4, (LZ4, ZSTD)) == "none"
    assert choose_compression("auto", None, 4, (LZ4, ZSTD)) == "none"
    assert choose_compression("auto", 0.4, 4, ()) == "none"


def test_incompressible_data_is_never_compressed() -> None:
    flat = CodecSpeed("lz4", ratio=1.0, compress_gbps=50.0, decompress_gbps=50.0)
    assert choose_compression("auto", 0.01, 1, (flat,)) == "none"


def test_explicit_modes_and_bad_input() -> None:
    assert choose_compression("zstd", None, 4, ()) == "zstd"
    assert choose_compression("none", 0.01, 1, (ZSTD,)) == "none"
    with pytest.raises(ConfigError, match="'brotli'"):
        choose_compression("brotli", 1.0, 4, ())
    with pytest.raises(ConfigError, match="compress_gbps"):
        CodecSpeed("x", 1.5, 0.0, 1.0)
