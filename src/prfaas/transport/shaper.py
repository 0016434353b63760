"""An in-process token bucket that emulates an inter-datacenter link on loopback.

One bucket is shared by every connection of a link, so N connections together respect the link
rate. Accounting is by debt: `acquire(n)` takes n tokens at once (the balance may go negative)
and sleeps until the debt is repaid, so a frame larger than the burst still passes at the
configured rate and concurrent callers queue in arrival order without a lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prfaas.core.errors import ConfigError
from prfaas.core.units import gbps_to_bytes_per_s

BURST_S = 0.010  # default burst: this much link time (see TokenBucket.__init__)


class TokenBucket:
    def __init__(self, rate_gbps: float, burst_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate_gbps > 0:
            raise ConfigError("rate_gbps", rate_gbps, "must be positive")
        self.rate_bytes_per_s = gbps_to_bytes_per_s(rate_gbps)
        # Default burst: 10 ms of link time, with no byte floor. The burst is what an idle link
        # lets through for free, so it must be bounded in *time*: 10 ms absorbs a late wake-up
        # of the event loop (the refill covering an oversleep is capped at the burst) and is
        # the most any transfer gains over bytes / rate, whatever the rate. The old floor of
        # 1 MiB was 0.84 s of a 0.01 Gbps link: a KV under 1 MiB crossed at loopback speed.
        # No floor is needed for timer resolution: with debt accounting each frame sleeps for
        # its own link time, so a frame larger than the burst still passes at the rate.
        default_burst = max(1, int(self.rate_bytes_per_s * BURST_S))
        self.burst_bytes = default_burst if burst_bytes is None else burst_bytes
        if self.burst_bytes <= 0:
            raise ConfigError("burst_bytes", burst_bytes, "must be positive")
        self._clock = clock
        self._tokens = float(self.burst_bytes)
        self._last_s = clock()

    def take(self, n_bytes: int) -> float:
        """Charge n_bytes now; return how long the caller must wait before sending them."""
        now_s = self._clock()
        refill = (now_s - self._last_s) * self.rate_bytes_per_s
        self._tokens = min(float(self.burst_bytes), self._tokens + refill)
        self._last_s = now_s
        self._tokens -= n_bytes
        return max(0.0, -self._tokens / self.rate_bytes_per_s)

    async def acquire(self, n_bytes: int) -> None:
        wait_s = self.take(n_bytes)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
