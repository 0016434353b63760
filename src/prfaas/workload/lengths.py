"""Input-length distributions as exact discrete pmfs over integer token counts.

Every distribution is held as a pmf on the integers [lo, hi] with prefix sums, so the planner's
conditional quantities are exact sums, not sampling noise:
P(L > t), E[L | L > t], E[L | L <= t] and E[f(L) | ...] for any vectorised f.
A truncated log-normal is discretised by integrating its density over [l - 0.5, l + 0.5]
(clipped to the truncation bounds); an empirical distribution is the normalised histogram of
observed lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prfaas.core.errors import ConfigError
from prfaas.workload.normal import ndtr

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class LengthDistribution:
    """A pmf over integer lengths lo..hi (tokens)."""

    lo: int
    pmf: FloatArray  # pmf[i] = P(L = lo + i)
    name: str = ""
    _cdf: FloatArray = field(init=False, repr=False)
    _cum_l: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        total = float(self.pmf.sum())
        if self.pmf.ndim != 1 or self.pmf.size == 0 or not total > 0:
            raise ConfigError("lengths", self.name, "empty length distribution")
        object.__setattr__(self, "pmf", self.pmf / total)
        object.__setattr__(self, "_cdf", np.cumsum(self.pmf))
        object.__setattr__(self, "_cum_l", np.cumsum(self.pmf * self.support))

    @property
    def support(self) -> FloatArray:
        return np.arange(self.lo, self.lo + self.pmf.size, dtype=float)

    @property
    def hi(self) -> int:
        return self.lo + self.pmf.size - 1

    def _index(self, t: float) -> int:
        """Number of support points <= t."""
        return int(np.clip(np.floor(t) - self.lo + 1, 0, self.pmf.size))

    def prob_above(self, t: float) -> float:
        i = self._index(t)
        return 1.0 - float(self._cdf[i - 1]) if i > 0 else 1.0

    def mean(self) -> float:
        return float(self._cum_l[-1])

    def mean_above(self, t: float) -> float:
        """E[L | L > t] (nan if P(L > t) = 0)."""
        i = self._index(t)
        below = float(self._cum_l[i - 1]) if i > 0 else 0.0
        p = self.prob_above(t)
        return (self.mean() - below) / p if p > 0 else float("nan")

    def mean_below(self, t: float) -> float:
        """E[L | L <= t] (nan if P(L <= t) = 0)."""
        i = self._index(t)
        if i == 0:
            return float("nan")
        return float(self._cum_l[i - 1]) / float(self._cdf[i - 1])

    def expect(self, f: Callable[[FloatArray], FloatArray], t: float, above: bool) -> float:
        """E[f(L) | L > t] if `above` else E[f(L) | L <= t] (nan on an empty side)."""
        i = self._index(t)
        sl = slice(i, None) if above else slice(0, i)
        weights = self.pmf[sl]
        mass = float(weights.sum())
        if mass <= 0:
            return float("nan")
        return float(np.dot(weights, f(self.support[sl])) / mass)

    def quantile(self, q: float) -> int:
        return int(self.lo + np.searchsorted(self._cdf, q))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        return (self.lo + np.minimum(idx, self.pmf.size - 1)).astype(np.int64)


def truncated_lognormal(mu: float, sigma: float, min_tokens: int, max_tokens: int
                        ) -> LengthDistribution:
    """Log-normal(mu, sigma) of token counts truncated to [min_tokens, max_tokens]."""
    if sigma <= 0:
        raise ConfigError("workload.input.sigma", sigma, "must be positive")
    if not 0 < min_tokens <= max_tokens:
        raise ConfigError("workload.input.min_tokens", min_tokens,
                          f"must be positive and <= max_tokens ({max_tokens})")
    lengths = np.arange(min_tokens, max_tokens + 1, dtype=float)
    edges = np.concatenate([[min_tokens], lengths[:-1] + 0.5, [max_tokens]])
    edges = np.clip(edges, min_tokens, max_tokens)
    cdf = ndtr((np.log(np.maximum(edges, 1e-9)) - mu) / sigma)
    pmf = np.diff(cdf)
    return LengthDistribution(min_tokens, pmf,
                              f"lognormal(mu={mu}, sigma={sigma}) on [{min_tokens}, {max_tokens}]")


def empirical(lengths: Sequence[int] | NDArray[np.int64], name: str = "empirical"
              ) -> LengthDistribution:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        raise ConfigError("lengths", name, "no lengths to build a distribution from")
    if arr.min() < 0:
        raise ConfigError("lengths", int(arr.min()), "negative length")
    lo = int(arr.min())
    counts = np.bincount(arr - lo).astype(float)
    return LengthDistribution(lo, counts, f"{name} ({arr.size} samples)")


def fixed(length_tokens: int) -> LengthDistribution:
    return LengthDistribution(length_tokens, np.ones(1), f"fixed {length_tokens}")


def from_config(raw: dict[str, Any], where: str = "workload.input") -> LengthDistribution:
    """Build from a scenario mapping: {dist: lognormal, mu, sigma, min_tokens, max_tokens} or
    {dist: fixed, tokens} or {dist: trace, path, [column]} (the trace's input lengths)."""
    dist = raw.get("dist")
    if dist == "lognormal":
        unknown = set(raw) - {"dist", "mu", "sigma", "min_tokens", "max_tokens"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}", raw[sorted(unknown)[0]],
                              "not a field of a lognormal length distribution")
        for key in ("mu", "sigma", "min_tokens", "max_tokens"):
            if key not in raw:
                raise ConfigError(f"{where}.{key}", None, "missing")
        return truncated_lognormal(float(raw["mu"]), float(raw["sigma"]),
                                   int(raw["min_tokens"]), int(raw["max_tokens"]))
    if dist == "fixed":
        tokens = raw.get("tokens")
        if not isinstance(tokens, int) or tokens <= 0:
            raise ConfigError(f"{where}.tokens", tokens, "must be a positive integer")
        return fixed(tokens)
    raise ConfigError(f"{where}.dist", dist, "unknown length distribution; known: lognormal, fixed")
