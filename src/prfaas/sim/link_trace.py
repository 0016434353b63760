"""The simulated link's carried bytes over time: a plugin that reads the link's byte counter
(`SharedLink.bytes_sent`, what the processor-sharing link has delivered) every `period_s`,
as a link monitor reads a live link's counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prfaas.core.errors import ConfigError
from prfaas.sim.plugin import SimPlugin

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator


class LinkTrace(SimPlugin):
    def __init__(self, period_s: float) -> None:
        if not period_s > 0:
            raise ConfigError("link trace period_s", period_s, "must be positive")
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]  # (time s, bytes carried)
        self._sim: Simulator | None = None

    def attach(self, sim: Simulator) -> None:
        self._sim = sim
        sim.call_at(self.period_s, self._sample)

    def _sample(self) -> None:
        sim = self._sim
        assert sim is not None
        sim.link.advance(sim.now_s)  # bring the counter to now (idempotent at one instant)
        self.samples.append((sim.now_s, sim.link.bytes_sent))
        if sim.busy():
            sim.call_at(sim.now_s + self.period_s, self._sample)
