"""A workload: the requests a simulation or a load generator replays, as parallel arrays.

`synthetic` draws lengths from a scenario's distribution and times from an arrival process;
each uses its own generator derived from one seed, so the lengths do not change when the rate or
the arrival process does (common random numbers: a capacity search stays monotone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from prfaas.core.errors import ConfigError
from prfaas.workload.arrivals import ArrivalProcess, check_rate
from prfaas.workload.lengths import LengthDistribution

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Workload:
    arrival_s: FloatArray  # nondecreasing
    input_tokens: IntArray
    output_tokens: IntArray
    source: str
    hash_ids: tuple[tuple[int, ...], ...] | None = None  # chained 512-token block ids per request

    def __post_init__(self) -> None:
        n = self.arrival_s.size
        if self.input_tokens.size != n or self.output_tokens.size != n:
            raise ConfigError("workload", self.source, "arrays of different lengths")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ConfigError("workload.hash_ids", self.source, "one entry per request needed")

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def offered_rps(self) -> float:
        """Requests per second over the arrival span ((n - 1) gaps; nan below two requests)."""
        n = len(self)
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if n else 0.0
        return (n - 1) / span if n > 1 and span > 0 else float("nan")

    def head(self, n: int) -> Workload:
        hashes = self.hash_ids[:n] if self.hash_ids is not None else None
        return Workload(self.arrival_s[:n], self.input_tokens[:n], self.output_tokens[:n],
                        self.source, hashes)

    def until(self, duration_s: float) -> Workload:
        """The requests that arrive before `duration_s` (from the first arrival)."""
        n = int(np.searchsorted(self.arrival_s - self.arrival_s[0], duration_s, side="left")) \
            if len(self) else 0
        return self.head(n)

    def rescaled(self, rate_rps: float) -> Workload:
        """The same requests with the time axis stretched so the mean rate is `rate_rps`."""
        rate = check_rate(rate_rps)
        native = self.offered_rps()
        if not native > 0:
            raise ConfigError("rate", rate_rps, f"cannot rescale {self.source}: no time span")
        t = (self.arrival_s - self.arrival_s[0]) * (native / rate)
        return Workload(t, self.input_tokens, self.output_tokens,
                        f"{self.source} rescaled to {rate:g} req/s", self.hash_ids)


def stratified_lengths(lengths: LengthDistribution, rng: np.random.Generator, n: int
                       ) -> IntArray:
    """`n` lengths, one from each of n equal-probability strata of the distribution, in random
    order (Latin hypercube sampling): the sample's mean service time, offload fraction and so
    on match the distribution far more closely than n independent draws do, which a capacity
    estimate of a heavy-tailed workload needs."""
    u = (rng.permutation(n) + rng.random(n)) / n
    idx = np.searchsorted(np.cumsum(lengths.pmf), u, side="right")
    return (lengths.lo + np.minimum(idx, lengths.pmf.size - 1)).astype(np.int64)


def synthetic(lengths: LengthDistribution, output_tokens: int, arrivals: ArrivalProcess,
              rate_rps: float, n: int, seed: int, stratified: bool = False) -> Workload:
    """`n` requests with lengths from `lengths` (independent draws, or stratified) and times
    from `arrivals` at `rate_rps`."""
    if n < 1:
        raise ConfigError("requests", n, "must be at least 1")
    if output_tokens < 1:
        raise ConfigError("output_tokens", output_tokens, "must be at least 1")
    length_rng, time_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = arrivals.times_s(time_rng, rate_rps, n)
    inputs = stratified_lengths(lengths, length_rng, n) if stratified \
        else lengths.sample(length_rng, n)
    outputs = np.full(n, output_tokens, dtype=np.int64)
    return Workload(times, inputs, outputs, f"{arrivals.name} at {rate_rps:g} req/s, seed {seed}")
