"""One verdict for a probe run, computed the same way from a live run and from a simulated one.

Input: per request its arrival, first-token (KV at the decoder) and finish times, in seconds
from the run's start (nan when it did not finish). Sustainable at offered rate r:
- the first-token throughput in the steady window [first arrival + span/4, last arrival] is
  >= 98% of r (first tokens, not completions: a probe of a few hundred requests is too short
  for the decode time, ~30 scenario seconds, to leave the window's count unbiased, while TTFT
  is short beside the warm-up quarter; decode is not the bottleneck of any system here, and
  every request must also complete);
- the queue does not grow: the mean number of requests in the system (arrived, first token not
  yet out) seen by arrivals in the last quarter exceeds the second quarter's by at most
  max(2, 10% of the mean);
- every request completed.
This is the simulator's capacity criterion (sim/capacity.py) with first tokens in place of
completions, for probes short enough to run live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

THROUGHPUT_SHARE = 0.98
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
    ok = (throughput >= THROUGHPUT_SHARE * rate_rps and completed == n
          and growth <= max(GROWTH_MIN, GROWTH_SHARE * mean))
    return ProbeResult(round(rate_rps, 6), bool(ok), throughput, growth, mean, completed, n,
                       stats(ready - arrival), stats(finish - arrival))


@dataclass
class Search:
    """Bracket then bisect on the offered rate: from `start_rps`, steps of `step` until one
    sustainable and one unsustainable rate bracket the capacity, then bisections until the
    bracket is within `rel_tol` (or `max_probes` ran). `probe(rate)` runs one probe."""

    probe: Callable[[float], ProbeResult]
    start_rps: float
    step: float = 1.08
    rel_tol: float = 0.03
    max_probes: int = 8
    probes: list[ProbeResult] = field(default_factory=list)

    def run(self) -> float:
        lo = hi = 0.0
        rate = self.start_rps
        while len(self.probes) < self.max_probes and (lo == 0.0 or hi == 0.0):
            if self._ok(rate):
                lo, rate = rate, rate * self.step
            else:
                hi, rate = rate, rate / self.step
        while lo and hi and hi - lo > self.rel_tol * lo and len(self.probes) < self.max_probes:
            mid = (lo + hi) / 2
            if self._ok(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _ok(self, rate: float) -> bool:
        result = self.probe(rate)
        self.probes.append(result)
        return result.sustainable
