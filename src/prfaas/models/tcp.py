"""What TCP over a long, lossy path lets one KV transfer carry (the inter-cluster link model).

A transfer uses `connections` TCP connections. Each is bounded by Mathis et al.'s steady-state
throughput of a loss-limited flow,
    rate_per_connection = C * MSS / (RTT * sqrt(p)),  C = sqrt(3/2) ~ 1.22,
and, when given, by `per_connection_gbps` (e.g. a sender's own ceiling). The transfer's cap is
the sum over its connections; the link's rate caps it again (`effective_gbps`). Every transfer
also pays one RTT of latency (the last byte's propagation plus the receiver's notice back,
the request/acknowledgement round trip a KV pull costs), added to its bandwidth-limited time.

Defaults (rtt 0, loss 0, no per-connection ceiling) bound nothing and add nothing: a scenario
without these keys plans and simulates exactly as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.core.errors import ConfigError

MATHIS_C = math.sqrt(1.5)  # ~1.2247: periodic-loss constant of Mathis et al. (1997)
DEFAULT_MSS_BYTES = 1448  # 1500-byte MTU minus IP/TCP headers with timestamps


@dataclass(frozen=True, slots=True)
class TcpPath:
    rtt_ms: float = 0.0
    loss: float = 0.0  # packet loss probability p
    connections: int = 1
    mss_bytes: int = DEFAULT_MSS_BYTES
    per_connection_gbps: float | None = None

    def __post_init__(self) -> None:
        if not (self.rtt_ms >= 0 and math.isfinite(self.rtt_ms)):
            raise ConfigError("link.rtt_ms", self.rtt_ms, "must be >= 0 milliseconds")
        if not 0 <= self.loss < 1:
            raise ConfigError("link.loss", self.loss, "must be a probability in [0, 1)")
        if self.connections < 1:
            raise ConfigError("link.connections", self.connections, "must be at least 1")
        if self.mss_bytes < 1:
            raise ConfigError("link.mss_bytes", self.mss_bytes, "must be positive bytes")
        if self.per_connection_gbps is not None and not self.per_connection_gbps > 0:
            raise ConfigError("link.per_connection_gbps", self.per_connection_gbps,
                              "must be positive")

    @property
    def rtt_s(self) -> float:
        return self.rtt_ms / 1000.0

    def mathis_gbps(self) -> float | None:
        """One connection's loss-limited throughput; None when loss or RTT is 0 (no bound)."""
        if self.loss <= 0 or self.rtt_ms <= 0:
            return None
        return MATHIS_C * self.mss_bytes * 8 / (self.rtt_s * math.sqrt(self.loss)) / 1e9

    def transfer_cap_gbps(self) -> float | None:
        """What one transfer's connections can carry together; None when unbounded."""
        bounds = [b for b in (self.mathis_gbps(), self.per_connection_gbps) if b is not None]
        return self.connections * min(bounds) if bounds else None

    def effective_gbps(self, rate_gbps: float) -> float:
        """The link rate, or one transfer's cap when that is lower."""
        cap = self.transfer_cap_gbps()
        return rate_gbps if cap is None or cap >= rate_gbps else cap

    @staticmethod
    def loss_for(goodput_gbps: float, rtt_ms: float, mss_bytes: int = DEFAULT_MSS_BYTES
                 ) -> float:
        """The loss p at which Mathis' bound of one connection equals `goodput_gbps`."""
        if not goodput_gbps > 0 or not rtt_ms > 0:
            raise ConfigError("goodput_gbps/rtt_ms", (goodput_gbps, rtt_ms), "must be positive")
        return (MATHIS_C * mss_bytes * 8 / (rtt_ms / 1000.0 * goodput_gbps * 1e9)) ** 2
