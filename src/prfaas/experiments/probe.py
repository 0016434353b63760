"""One verdict for a probe run, computed the same way from a live run and from a simulated one.

Input: per request its arrival, ready and finish times, in seconds from the run's start (nan
when it did not finish); "ready" is the request's KV held by its decoder, whose first token is
then sampled, on both sides (runs.py). Sustainable at offered rate r:
- the ready-event throughput in the steady window [first arrival + span/4, last arrival] is
  >= 98% of r, or short of r x window by at most 2 requests (the window's edges cut a request
  or two either way, and a probe of ~50 requests at a third of capacity is not overloaded;
  the same floor as the queue criterion's; near capacity, with >100 requests in the window,
  the 98% governs) (ready events, not completions: a probe of a few hundred requests is too short
  for the decode time, ~30 scenario seconds, to leave the window's count unbiased, while TTFT
  is short beside the warm-up quarter; decode is not the bottleneck of any system here, and
  every request must also complete);
- the queue does not grow: the mean number of requests in the system (arrived, first token not
  yet out) seen by arrivals in the last quarter exceeds the second quarter's by at most
  max(2, 10% of the mean);
- every request completed.
This is the simulator's capacity criterion (sim/capacity.py) with ready events in place of
completions, for probes short enough to run live. `Search` is the one capacity search both
sides run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

THROUGHPUT_SHARE = 0.98
THROUGHPUT_MIN_DEFICIT = 2.0  # requests
GROWTH_MIN = 2.0
GROWTH_SHARE = 0.1
FloatArray = np.ndarray


@dataclass(frozen=True)
class ProbeResult:
    rate_rps: float
    sustainable: bool
    throughput_rps: float
    queue_growth: float
    queue_mean: float
    completed: int
    requests: int
    ttft_s: dict[str, float]
    e2e_s: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in vars(self).items()}


def stats(values: FloatArray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {}
    return {"mean": round(float(v.mean()), 5),
            **{f"p{q}": round(float(np.percentile(v, q)), 5) for q in (50, 90, 99)}}


def judge(rate_rps: float, arrival: FloatArray, ready: FloatArray, finish: FloatArray
          ) -> ProbeResult:
    n = arrival.size
    first, last = float(arrival.min()), float(arrival.max())
    lo = first + (last - first) / 4
    done = np.isfinite(ready)
    in_window = int(((ready >= lo) & (ready <= last) & done).sum())
    throughput = in_window / (last - lo) if last > lo else 0.0
    order = np.argsort(arrival, kind="stable")
    arr, rdy = arrival[order], np.where(done, ready, np.inf)[order]
    # requests in the system when request i arrives: arrived before it, first token not out
    seen = np.array([int(np.sum(rdy[:i] > arr[i])) for i in range(n)], dtype=float)
    q = n // 4
    growth = float(seen[3 * q:].mean() - seen[q:2 * q].mean()) if q else 0.0
    mean = float(seen.mean()) if n else 0.0
    completed = int(np.isfinite(finish).sum())
    deficit = rate_rps * (last - lo) - in_window
    ok = ((throughput >= THROUGHPUT_SHARE * rate_rps or deficit <= THROUGHPUT_MIN_DEFICIT)
          and completed == n
          and growth <= max(GROWTH_MIN, GROWTH_SHARE * mean))
    return ProbeResult(round(rate_rps, 6), bool(ok), throughput, growth, mean, completed, n,
                       stats(ready - arrival), stats(finish - arrival))


@dataclass(frozen=True)
class Bracket:
    """What a search found: the highest sustained and the lowest unsustained rate it probed
    (None when no probe gave that verdict), and whether (hi - lo) / lo reached the tolerance."""

    sustained_rps: float | None
    unsustained_rps: float | None
    converged: bool

    @property
    def width(self) -> float | None:
        lo, hi = self.sustained_rps, self.unsustained_rps
        return (hi - lo) / lo if lo and hi else None


class Verdict(Protocol):
    """What a search reads of a probe: whether the rate was sustained."""

    @property
    def sustainable(self) -> bool: ...


V = TypeVar("V", bound=Verdict)


@dataclass
class Search(Generic[V]):
    """A capacity search that sees nothing but its probe's verdicts: it starts at `start_rps`
    (a fixed low rate chosen before any estimate exists, never the simulator's or planner's
    figure), doubles the rate while probes are sustained (halves it while they are not) until
    one sustained and one unsustained rate bracket the capacity, then bisects until
    (unsustained - sustained) / sustained <= `rel_tol` or `max_probes` ran. The live run and
    the simulator use this same procedure on the same probe workloads (a probe's verdict: a
    `ProbeResult`, or experiments/regions_capacity.py's `MixProbe` where the "rate" is a
    scale of a multi-cluster plan's rates)."""

    probe: Callable[[float], V]
    start_rps: float
    rel_tol: float = 0.02
    max_probes: int = 16
    probes: list[V] = field(default_factory=list)

    def run(self) -> Bracket:
        lo: float | None = None
        hi: float | None = None
        rate = self.start_rps
        while (lo is None or hi is None) and len(self.probes) < self.max_probes:
            if self._ok(rate):
                lo, rate = rate, 2.0 * rate
            else:
                hi, rate = rate, rate / 2.0
        while (lo is not None and hi is not None and hi - lo > self.rel_tol * lo
               and len(self.probes) < self.max_probes):
            mid = (lo + hi) / 2
            if self._ok(mid):
                lo = mid
            else:
                hi = mid
        converged = lo is not None and hi is not None and hi - lo <= self.rel_tol * lo
        return Bracket(lo, hi, converged)

    def _ok(self, rate: float) -> bool:
        result = self.probe(rate)
        self.probes.append(result)
        return result.sustainable
