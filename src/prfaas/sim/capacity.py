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

from collections.abc import Callable, Generator
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


def run_probe(cfg: SystemConfig, lengths: LengthDistribution, output_tokens: int,
              arrivals: ArrivalProcess, rate: float, requests: int, seed: int) -> Probe:
    """One simulation at `rate` (a pure function of its arguments: runs anywhere, in any order)."""
    workload = synthetic(lengths, output_tokens, arrivals, rate, requests, seed, stratified=True)
    _, summary = simulate(cfg, workload)
    return Probe(round(rate, 6), sustainable(summary, rate), summary["throughput_rps"] or 0.0,
                 summary["queue"]["growth"], summary["ttft_s"]["p90"])


def search_rates(guess_rps: float, rel_tol: float = 0.005,
                 max_probes: int = 24) -> Generator[float, bool, float]:
    """The search itself: yields the next rate to probe, is sent whether it was sustainable,
    returns the capacity. No simulation here, so a driver may replay it on assumed verdicts
    to know which rates come next (serve/deploy/ray/sweep.py probes them ahead, in parallel)."""
    lo, hi, probes = 0.0, 0.0, 0
    rate = guess_rps
    while probes < max_probes and (lo == 0.0 or hi == 0.0):
        probes += 1
        if (yield rate):
            lo = rate
            rate = rate * 1.08 if hi == 0.0 else rate
        else:
            hi = rate
            rate = rate / 1.08
    while hi > 0 and lo > 0 and (hi - lo) > rel_tol * lo and probes < max_probes:
        mid = (lo + hi) / 2
        probes += 1
        if (yield mid):
            lo = mid
        else:
            hi = mid
    return lo


def find_capacity(cfg: SystemConfig, lengths: LengthDistribution, output_tokens: int,
                  arrivals: ArrivalProcess, *, requests: int = 4000, seed: int = 0,
                  guess_rps: float = 1.0, rel_tol: float = 0.005, max_probes: int = 24,
                  on_probe: Callable[[Probe], None] | None = None,
                  probe_at: Callable[[float], Probe] | None = None) -> CapacityResult:
    """`probe_at(rate)`: how a probe is obtained (default: simulated here, now)."""
    check_capacity_args(guess_rps, requests)
    result = CapacityResult(cfg.system, 0.0)
    if probe_at is None:
        def probe_at(rate: float) -> Probe:
            return run_probe(cfg, lengths, output_tokens, arrivals, rate, requests, seed)
    search = search_rates(guess_rps, rel_tol, max_probes)
    try:
        rate = next(search)
        while True:
            p = probe_at(rate)
            result.probes.append(p)
            if on_probe:
                on_probe(p)
            rate = search.send(p.sustainable)
    except StopIteration as done:
        result.max_rps = done.value
    return result


def check_capacity_args(guess_rps: float, requests: int) -> None:
    check_rate(guess_rps, "guess_rps")
    if requests < 100:
        raise ConfigError("requests", requests, "a capacity search needs >= 100 requests")
