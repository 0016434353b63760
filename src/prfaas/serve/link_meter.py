"""The bytes each destination's link really carried, read where the kernel counts them.

The tenant gateway (serve/gateway.py) holds each destination's KV against its egress budget
before a prefill starts, from the rate a prefill emits (Eq. 1); the KV itself goes from the
prefill worker straight to the destination's decoders, never through the gateway. This meter is
the check on the wire: every `interval_s` it reads each destination's link interface counter
(`/sys/class/net/IF/statistics/tx_bytes`: bytes the interface sent, KV plus TCP/IP headers and
the small HTTP replies that share the link) and keeps per destination the bytes since the
gateway started, the rate over the last interval, the highest interval rate and how many
intervals carried more than the budget. A destination without an interface is not metered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError

SYSFS_NET = Path("/sys/class/net")


def tx_bytes(interface: str) -> int:
    """The interface's transmitted-bytes counter (this network namespace's view)."""
    try:
        return int((SYSFS_NET / interface / "statistics" / "tx_bytes").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("link_interface", interface,
                          f"no byte counter to read here ({type(exc).__name__})") from exc


@dataclass
class _Line:
    interface: str
    budget_gbps: float
    start_bytes: int
    last_bytes: int
    last_s: float
    total_bytes: int = 0
    gbps: float = 0.0
    max_gbps: float = 0.0
    intervals: int = 0
    over_budget: int = 0


class LinkMeter:
    """Per destination, its link interface's bytes against its budget (module docstring).
    `read` returns an interface's counter (a test passes its own)."""

    def __init__(self, interfaces: Mapping[str, str], budgets_gbps: Mapping[str, float],
                 now_s: float, read: Callable[[str], int] = tx_bytes) -> None:
        self.read = read
        self.lines: dict[str, _Line] = {}
        for dest, interface in interfaces.items():
            first = read(interface)  # an interface that cannot be read fails here, once
            self.lines[dest] = _Line(interface, budgets_gbps[dest], first, first, now_s)

    def sample(self, now_s: float) -> None:
        for line in self.lines.values():
            count = self.read(line.interface)
            dt = now_s - line.last_s
            if dt <= 0:
                continue
            line.gbps = (count - line.last_bytes) * 8 / 1e9 / dt
            line.max_gbps = max(line.max_gbps, line.gbps)
            line.intervals += 1
            line.over_budget += line.gbps > line.budget_gbps
            line.total_bytes = count - line.start_bytes
            line.last_bytes, line.last_s = count, now_s

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {d: {"interface": x.interface, "link_bytes": x.total_bytes,
                    "link_gbps": round(x.gbps, 6), "link_gbps_max": round(x.max_gbps, 6),
                    "intervals": x.intervals, "over_budget_intervals": x.over_budget}
                for d, x in self.lines.items()}
