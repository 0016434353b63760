"""LinkMonitor: what the threshold controller reads about one PrfaaS egress link.

Senders report bytes as they hand them to the kernel and bytes queued but not yet sent; the
monitor keeps a sliding window and turns it into egress bytes/s. Retransmissions come from a
source callable (a sender's `tcp_retransmits`). The clock is injected so tests need no sleeps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prfaas.core.errors import ConfigError
from prfaas.core.units import bytes_per_s_to_gbps


@dataclass(frozen=True, slots=True)
class LinkSample:
    t_s: float
    egress_bytes_per_s: float
    pending_bytes: int
    retransmits: int
    total_sent_bytes: int

    @property
    def egress_gbps(self) -> float:
        return bytes_per_s_to_gbps(self.egress_bytes_per_s)


class LinkMonitor:
    def __init__(self, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not window_s > 0:
            raise ConfigError("window_s", window_s, "must be positive")
        self.window_s = window_s
        self._clock = clock
        self._events: deque[tuple[float, int]] = deque()
        self._window_bytes = 0
        self.total_sent_bytes = 0
        self.pending_bytes = 0
        self._retransmit_sources: list[Callable[[], int]] = []

    def record_sent(self, n_bytes: int) -> None:
        self._events.append((self._clock(), n_bytes))
        self._window_bytes += n_bytes
        self.total_sent_bytes += n_bytes

    def add_pending(self, n_bytes: int) -> None:
        self.pending_bytes += n_bytes

    def remove_pending(self, n_bytes: int) -> None:
        self.pending_bytes -= n_bytes

    def add_retransmit_source(self, source: Callable[[], int]) -> None:
        self._retransmit_sources.append(source)

    def egress_bytes_per_s(self) -> float:
        """Bytes sent in the last `window_s`, divided by `window_s`."""
        horizon_s = self._clock() - self.window_s
        while self._events and self._events[0][0] < horizon_s:
            self._window_bytes -= self._events.popleft()[1]
        return self._window_bytes / self.window_s

    def retransmits(self) -> int:
        return sum(source() for source in self._retransmit_sources)

    def sample(self) -> LinkSample:
        rate = self.egress_bytes_per_s()
        return LinkSample(self._clock(), rate, self.pending_bytes, self.retransmits(),
                          self.total_sent_bytes)
