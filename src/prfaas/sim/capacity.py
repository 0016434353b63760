"""Capacity search: the highest offered rate a system sustains, by simulation.

Sustainable at rate r: steady-window throughput >= 98% of r and no queue growing through the
run (the mean number in the system seen by arrivals in the last quarter exceeds the second
quarter's by at most max(10, 10% of its mean)). Every probe replays the same seed (same
stratified lengths, same unit inter-arrival gaps stretched to the rate: common random
numbers), so the verdict is nearly monotone in r and a bracket-then-bisect search converges.
The first probe is `guess_rps` (e.g. the planner's estimate); it only sets where the search
starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.sim.run import simulate
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import ArrivalProcess, check_rate
from prfaas.workload.lengths import LengthDistribution
from prfaas.workload.requests import synthetic

THROUGHPUT_SHARE = 0.98


@dataclass(frozen=True)
class Probe:
    rate_rps: float
    sustainable: bool
    throughput_rps: float
    queue_growth: float
    ttft_p90_s: float | None


@dataclass
class CapacityResult:
    system: str
    max_rps: float
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "max_rps": round(self.max_rps, 4),
                "probes": [vars(p) for p in self.probes]}


def sustainable(summary: dict[str, Any], rate_rps: float) -> bool:
    throughput = summary["throughput_rps"] or 0.0
    queue = summary["queue"]
    allowed = max(10.0, 0.1 * queue["in_system_mean"])
    return throughput >= THROUGHPUT_SHARE * rate_rps and queue["growth"] <= allowed


def find_capacity(cfg: SystemConfig, lengths: LengthDistribution, output_tokens: int,
                  arrivals: ArrivalProcess, *, requests: int = 4000, seed: int = 0,
                  guess_rps: float = 1.0, rel_tol: float = 0.005, max_probes: int = 24,
                  on_probe: Callable[[Probe], None] | None = None) -> CapacityResult:
    check_rate(guess_rps, "guess_rps")
    if requests < 100:
        raise ConfigError("requests", requests, "a capacity search needs >= 100 requests")
    result = CapacityResult(cfg.system, 0.0)

    def probe(rate: float) -> bool:
        workload = synthetic(lengths, output_tokens, arrivals, rate, requests, seed,
                             stratified=True)
        _, summary = simulate(cfg, workload)
        ok = sustainable(summary, rate)
        p = Probe(round(rate, 6), ok, summary["throughput_rps"] or 0.0,
                  summary["queue"]["growth"], summary["ttft_s"]["p90"])
        result.probes.append(p)
        if on_probe:
            on_probe(p)
        return ok

    lo, hi = 0.0, 0.0
    rate = guess_rps
    while len(result.probes) < max_probes and (lo == 0.0 or hi == 0.0):
        if probe(rate):
            lo = rate
            rate = rate * 1.08 if hi == 0.0 else rate
        else:
            hi = rate
            rate = rate / 1.08
    while hi > 0 and lo > 0 and (hi - lo) > rel_tol * lo and len(result.probes) < max_probes:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    result.max_rps = lo
    return result
