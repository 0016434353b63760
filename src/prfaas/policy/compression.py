"""Whether a link's KV is worth compressing losslessly, and with which codec: a pure decision
from measured codec speeds and the link's rate (no clock, no I/O; the caller measures).

Each of the sender's N connections compresses and each receiving thread decompresses its own
frames, so a connection moves uncompressed bytes at min(compress, decompress, share x ratio),
where share = link rate / N is its part of the link. `auto` picks the codec with the highest
such rate and compresses only when that beats the share itself (strictly); an unshaped link
(no rate) is taken as faster than any codec. `none`, `lz4` and `zstd` are taken as asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.errors import ConfigError

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
