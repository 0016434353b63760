"""Arrival processes: request arrival times at a given mean rate, from a seeded generator.

- `uniform`: evenly spaced, i / rate (the paper's assumption; no randomness).
- `poisson`: exponential inter-arrival times.
- `bursty`: Gamma inter-arrival times with coefficient of variation `cv` > 1 (default 3), i.e.
  clumps of near-simultaneous arrivals separated by long gaps, at the same mean rate.

Each process draws unit-rate gaps and divides them by `rate`, so the same seed at two rates gives
the same arrival pattern stretched in time (common random numbers for capacity searches).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prfaas.core.errors import ConfigError, UnknownNameError

FloatArray = NDArray[np.float64]


def check_rate(rate_rps: float, field: str = "rate") -> float:
    """A positive, finite request rate, or ConfigError."""
    rate = float(rate_rps)
    if not np.isfinite(rate) or rate <= 0:
        raise ConfigError(field, rate_rps, "must be a positive number of requests per second")
    return rate


class ArrivalProcess(ABC):
    name: str = "arrivals"

    def times_s(self, rng: np.random.Generator, rate_rps: float, n: int) -> FloatArray:
        """`n` nondecreasing arrival times (seconds, the first at 0) at mean rate `rate_rps`."""
        rate = check_rate(rate_rps)
        if n < 0:
            raise ConfigError("requests", n, "must be >= 0")
        gaps = self.unit_gaps(rng, n)
        if n:
            gaps[0] = 0.0
        return np.cumsum(gaps) / rate

    @abstractmethod
    def unit_gaps(self, rng: np.random.Generator, n: int) -> FloatArray:
        """`n` inter-arrival gaps with mean 1."""


class Uniform(ArrivalProcess):
    name = "uniform"

    def unit_gaps(self, rng: np.random.Generator, n: int) -> FloatArray:
        return np.ones(n)


class Poisson(ArrivalProcess):
    name = "poisson"

    def unit_gaps(self, rng: np.random.Generator, n: int) -> FloatArray:
        return rng.exponential(1.0, n)


class Bursty(ArrivalProcess):
    """Gamma(shape = 1/cv^2, scale = cv^2) gaps: mean 1, coefficient of variation `cv`."""

    name = "bursty"

    def __init__(self, cv: float = 3.0) -> None:
        if not cv > 0:
            raise ConfigError("arrivals.cv", cv, "must be positive")
        self.cv = float(cv)

    def unit_gaps(self, rng: np.random.Generator, n: int) -> FloatArray:
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, 1.0 / shape, n)


_REGISTRY: dict[str, Callable[..., ArrivalProcess]] = {
    "uniform": Uniform, "poisson": Poisson, "bursty": Bursty,
}


def arrival_names() -> list[str]:
    return sorted(_REGISTRY)


def make_arrivals(name: str, **kwargs: Any) -> ArrivalProcess:
    if name not in _REGISTRY:
        raise UnknownNameError("arrivals", name, arrival_names())
    return _REGISTRY[name](**kwargs)
