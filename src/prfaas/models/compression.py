"""Whether a link's KV is worth compressing losslessly, with which codec, and what it then
weighs on the wire: a pure decision from measured codec speeds and the link's rate (no clock;
the live sender measures its own KV, the scenario reads the figures measured on real KV,
data/codec_speeds.json). The live sender (transport/sender.py, through policy/compression.py)
and the scenario (and so the planner and the simulator) call the same `choose_compression`.

Each of the sender's N connections compresses and each receiving thread decompresses its own
frames, so a connection moves uncompressed bytes at min(compress, decompress, share x ratio),
where share = link rate / N is its part of the link. `auto` picks the codec with the highest
such rate and compresses only when that beats the share itself (strictly); an unshaped link
(no rate) is taken as faster than any codec. `none`, `lz4` and `zstd` are taken as asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from prfaas.core.errors import ConfigError, UnknownNameError

MODES = ("none", "lz4", "zstd", "auto")


@dataclass(frozen=True, slots=True)
class CodecSpeed:
    """A codec measured on representative KV: compression ratio (uncompressed / compressed)
    and single-thread rates in uncompressed Gbps."""

    name: str
    ratio: float
    compress_gbps: float
    decompress_gbps: float

    def __post_init__(self) -> None:
        for field in ("ratio", "compress_gbps", "decompress_gbps"):
            if not getattr(self, field) > 0:
                raise ConfigError(f"codec {self.name}.{field}", getattr(self, field),
                                  "must be positive")

    def connection_gbps(self, share_gbps: float) -> float:
        """Uncompressed Gbps one connection moves with this codec at a link share."""
        return min(self.compress_gbps, self.decompress_gbps, share_gbps * self.ratio)


def choose_compression(mode: str, rate_gbps: float | None, connections: int,
                       speeds: tuple[CodecSpeed, ...]) -> str:
    """The codec a link uses: "none" or a codec's name."""
    if mode not in MODES:
        raise ConfigError("link.compression", mode, f"must be one of {', '.join(MODES)}")
    if connections < 1:
        raise ConfigError("link.connections", connections, "must be >= 1")
    if mode != "auto":
        return mode
    if rate_gbps is None:
        return "none"
    share_gbps = rate_gbps / connections
    best = max(speeds, key=lambda s: s.connection_gbps(share_gbps), default=None)
    if best is None or best.connection_gbps(share_gbps) <= share_gbps:
        return "none"
    return best.name


def planned_codec(mode: str, rate_gbps: float | None, connections: int,
                  speeds: tuple[CodecSpeed, ...]) -> tuple[str, float]:
    """The codec a link uses (`choose_compression`) and the tensor / wire ratio to plan with:
    its measured ratio, or 1.0 for a codec without figures (a live router's prior then waits
    for the workers' reports). What the scenario and the live router both predict with."""
    codec = choose_compression(mode, rate_gbps, connections, speeds)
    known = codec == "none" or any(s.name == codec for s in speeds)
    return codec, wire_ratio(codec, speeds) if known else 1.0


def wire_ratio(codec: str, speeds: tuple[CodecSpeed, ...]) -> float:
    """Tensor bytes per wire byte with `codec` ("none": 1)."""
    if codec == "none":
        return 1.0
    for s in speeds:
        if s.name == codec:
            return s.ratio
    raise ConfigError("link.compression", codec,
                      f"no measured figures for it; measured: {[s.name for s in speeds]}")


@cache
def codec_table() -> dict[str, Any]:
    """The codec figures measured on real KV (data/codec_speeds.json; read once, not to be
    modified)."""
    text = resources.files("prfaas.data").joinpath("codec_speeds.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def known_speeds(kv: str | None, dtype: str) -> tuple[CodecSpeed, ...]:
    """`measured_speeds`, or none where nothing was measured (a live prior, not a config)."""
    table = codec_table()["kv"]
    if kv is None or dtype not in table.get(kv, {}):
        return ()
    return measured_speeds(kv, dtype)


def measured_speeds(kv: str, dtype: str) -> tuple[CodecSpeed, ...]:
    """The codecs as measured on KV `kv` (a key of data/codec_speeds.json, e.g. native_tiny)
    travelling in `dtype` (fp32, bf16, fp8_e4m3)."""
    table = codec_table()["kv"]
    if kv not in table:
        raise UnknownNameError("link.codec_kv", kv, sorted(table))
    if dtype not in table[kv]:
        raise ConfigError("link.codec_kv", kv,
                          f"no codec figures measured for {dtype} on the wire; measured: "
                          f"{sorted(table[kv])}")
    return tuple(CodecSpeed(name, float(f["ratio"]), float(f["compress_gbps"]),
                            float(f["decompress_gbps"]))
                 for name, f in sorted(table[kv][dtype].items()))
