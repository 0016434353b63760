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
sides run; `confirm` re-judges its bracket with longer probes.

Each verdict carries its margin in requests (`ProbeResult.margins`): per criterion, how many
requests it passed by (>= 0) or failed by (< 0): ready events in the window over the count the
throughput test needs; the queue allowance over the growth (requests in the system); for the
completion test, completed - requests when some did not complete. `margin_requests` is the
smallest of them: a sustained probe with margin 1.5 would have failed with two requests fewer
in its window (or two more in its queue), an unsustained one with margin -1 was one request
short. A verdict whose margin is within a request or two was decided by noise.
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
    margins: dict[str, float] = field(default_factory=dict)  # requests, per criterion

    @property
    def margin_requests(self) -> float | None:
        """The verdict's margin: the smallest criterion margin (module docstring)."""
        return min(self.margins.values()) if self.margins else None

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
    allowance = max(GROWTH_MIN, GROWTH_SHARE * mean)
    ok = ((throughput >= THROUGHPUT_SHARE * rate_rps or deficit <= THROUGHPUT_MIN_DEFICIT)
          and completed == n and growth <= allowance)
    # the same tests counted in requests: in_window passes iff >= `needed`
    expected = rate_rps * (last - lo)
    needed = min(THROUGHPUT_SHARE * expected, expected - THROUGHPUT_MIN_DEFICIT)
    # unrounded: a margin rounded to -0.0 would read as passing a criterion the verdict failed
    margins = {"throughput": float(in_window - needed), "queue": float(allowance - growth)}
    if completed < n:
        margins["completed"] = float(completed - n)
    return ProbeResult(round(rate_rps, 6), bool(ok), throughput, growth, mean, completed, n,
                       stats(ready - arrival), stats(finish - arrival), margins)


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


@dataclass
class Confirm(Generic[V]):
    """A search's bracket judged again with longer probes (`probe` runs them), so that the
    verdicts at the capacity rest on more requests than a short probe holds. From the short
    bracket [lo, hi]: lo is probed; while the long verdicts agree with each other the rate
    walks away from lo (up from a sustained lo, first to hi; down from an unsustained one) by
    a step that squares each time (hi / lo, then its square, ...), so a short bracket that was
    far off is left in a few probes; once one sustained and one unsustained long probe
    bracket the capacity, it is bisected until (unsustained - sustained) / sustained <=
    `rel_tol`. The answer's two ends were both judged on long probes; without both after
    `max_probes` it is returned unconverged (None at an end never reached). A short bracket
    without both ends is returned unconfirmed."""

    probe: Callable[[float], V]
    rel_tol: float = 0.02
    max_probes: int = 6
    probes: list[V] = field(default_factory=list)

    def run(self, short: Bracket) -> Bracket:
        lo, hi = short.sustained_rps, short.unsustained_rps
        if lo is None or hi is None or self.max_probes < 1:
            return Bracket(lo, hi, False)
        step = hi / lo
        ok_at: float | None = None
        over_at: float | None = None
        if self._ok(lo):
            ok_at, rate = lo, hi
            while self._left():
                if not self._ok(rate):
                    over_at = rate
                    break
                ok_at, step = rate, step * step
                rate = ok_at * step
        else:
            over_at, rate = lo, lo / step
            while self._left():
                if self._ok(rate):
                    ok_at = rate
                    break
                over_at, step = rate, step * step
                rate = over_at / step
        while (ok_at is not None and over_at is not None
               and over_at - ok_at > self.rel_tol * ok_at and self._left()):
            mid = (ok_at + over_at) / 2
            if self._ok(mid):
                ok_at = mid
            else:
                over_at = mid
        converged = (ok_at is not None and over_at is not None
                     and over_at - ok_at <= self.rel_tol * ok_at)
        return Bracket(ok_at, over_at, converged)

    def _left(self) -> bool:
        return len(self.probes) < self.max_probes

    def _ok(self, rate: float) -> bool:
        result = self.probe(rate)
        self.probes.append(result)
        return result.sustainable
