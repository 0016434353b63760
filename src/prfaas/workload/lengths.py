"""Input-length distributions as exact discrete pmfs over integer token counts.

Every distribution is held as a pmf on the integers [lo, hi] with prefix sums, so the planner's
conditional quantities are exact sums, not sampling noise:
P(L > t), E[L | L > t], E[L | L <= t] and E[f(L) | ...] for any vectorised f.
A truncated log-normal is discretised by integrating its density over [l - 0.5, l + 0.5]
(clipped to the truncation bounds); an empirical distribution is the normalised histogram of
observed lengths.

Each side of a threshold is summed from its own terms (a prefix sum below t, a suffix sum above
it), never as 1 minus the other side: 1 - P(L <= t) leaves a rounding residue (4.4e-16 at the
top of the support) that reads as a real probability. A side whose mass is below `PROB_TOL` is
empty: its probability is exactly 0, the other side's exactly 1, and its conditional means are
excluded (`Split.mean` gives 0.0 there and callers test `p_above > 0`), never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from prfaas.core.errors import ConfigError
from prfaas.workload.normal import ndtr

FloatArray = NDArray[np.float64]

# A side of a threshold with less mass than this holds no request. Why 1e-12:
# - rounding: each side is a sum of k <= n nonnegative terms, so its relative error is at most
#   (k - 1) * 2^-53 (1.5e-11 for n = 2^17 tokens): a mass well above PROB_TOL is never zeroed by
#   rounding, and a side that is empty in exact arithmetic sums to exactly 0;
# - data: an empirical distribution's smallest mass is 1 / N, > 1e-12 for any trace of fewer
#   than 10^12 requests, so no observed length is ever dropped;
# - effect: zeroing a mass p < 1e-12 changes the other side's Eq. 6 term Theta / (1 - p) by a
#   relative 1e-12, far below the search's 1e-9 tie tolerance, and removes a term Theta / p >
#   1e12 Theta that a real plan cannot bind on.
PROB_TOL = 1e-12


@dataclass(frozen=True)
class Split:
    """Both sides of each threshold t (arrays indexed like the thresholds)."""

    dist: LengthDistribution
    count_below: NDArray[np.intp]  # support points <= t
    p_below: FloatArray  # P(L <= t): 0 when below PROB_TOL, 1 when P(L > t) is
    p_above: FloatArray  # P(L > t), likewise
    raw_below: FloatArray  # the prefix and suffix sums before the tolerance
    raw_above: FloatArray

    def mean(self, values: FloatArray, above: bool) -> FloatArray:
        """E[v(L) | L > t] (above) or E[v(L) | L <= t] for `values` = v(support); 0.0 where
        that side is empty (excluded: test p_above / p_below > 0 before using it)."""
        weighted = self.dist.pmf * values
        if above:
            sums = np.append(np.cumsum(weighted[::-1])[::-1], 0.0)[self.count_below]
            mass, has = self.raw_above, self.p_above > 0
        else:
            sums = np.concatenate([[0.0], np.cumsum(weighted)])[self.count_below]
            mass, has = self.raw_below, self.p_below > 0
        out = np.zeros_like(mass)
        np.divide(sums, mass, out=out, where=has)
        return out


@dataclass(frozen=True)
class LengthDistribution:
    """A pmf over integer lengths lo..hi (tokens)."""

    lo: int
    pmf: FloatArray  # pmf[i] = P(L = lo + i)
    name: str = ""
    _cdf: FloatArray = field(init=False, repr=False)
    _sf: FloatArray = field(init=False, repr=False)  # _sf[i] = P(L >= lo + i), a suffix sum
    _mean: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        total = float(self.pmf.sum())
        if self.pmf.ndim != 1 or self.pmf.size == 0 or not total > 0 or not np.isfinite(total):
            raise ConfigError("lengths", self.name, "empty length distribution")
        if (self.pmf < 0).any():
            raise ConfigError("lengths", self.name, "negative probability in the pmf")
        object.__setattr__(self, "pmf", self.pmf / total)
        object.__setattr__(self, "_cdf", np.cumsum(self.pmf))
        object.__setattr__(self, "_sf", np.cumsum(self.pmf[::-1])[::-1])
        object.__setattr__(self, "_mean", float(np.cumsum(self.pmf * self.support)[-1]))

    @property
    def support(self) -> FloatArray:
        return np.arange(self.lo, self.lo + self.pmf.size, dtype=float)

    @property
    def hi(self) -> int:
        return self.lo + self.pmf.size - 1

    def split(self, thresholds: ArrayLike) -> Split:
        """Both sides of every threshold, each summed from its own terms (module docstring)."""
        t = np.asarray(thresholds, dtype=float)
        k = np.clip(np.floor(t) - self.lo + 1, 0, self.pmf.size).astype(np.intp)
        raw_below = np.concatenate([[0.0], self._cdf])[k]
        raw_above = np.append(self._sf, 0.0)[k]
        empty_below, empty_above = raw_below < PROB_TOL, raw_above < PROB_TOL
        p_below = np.where(empty_below, 0.0, np.where(empty_above, 1.0, raw_below))
        p_above = np.where(empty_above, 0.0, np.where(empty_below, 1.0, raw_above))
        return Split(self, k, p_below, p_above, raw_below, raw_above)

    def prob_above(self, t: float) -> float:
        return float(self.split([t]).p_above[0])

    def mean(self) -> float:
        return self._mean

    def mean_above(self, t: float) -> float | None:
        """E[L | L > t]; None when no request is longer than t."""
        return self.expect(lambda x: x, t, above=True)

    def mean_below(self, t: float) -> float | None:
        """E[L | L <= t]; None when no request is that short."""
        return self.expect(lambda x: x, t, above=False)

    def expect(self, f: Callable[[FloatArray], FloatArray], t: float, above: bool
               ) -> float | None:
        """E[f(L) | L > t] if `above` else E[f(L) | L <= t]; None on an empty side."""
        s = self.split([t])
        if not (s.p_above if above else s.p_below)[0] > 0:
            return None
        return float(s.mean(np.asarray(f(self.support), dtype=float), above)[0])

    def quantile(self, q: float) -> int:
        return int(self.lo + np.searchsorted(self._cdf, q))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        return (self.lo + np.minimum(idx, self.pmf.size - 1)).astype(np.int64)


def truncated_lognormal(mu: float, sigma: float, min_tokens: int, max_tokens: int
                        ) -> LengthDistribution:
    """Log-normal(mu, sigma) of token counts truncated to [min_tokens, max_tokens].

    The mass of [a, b] is Phi(z_b) - Phi(z_a) below the median and Q(z_a) - Q(z_b) above it
    (Q(z) = Phi(-z)), so both tails keep full relative precision: differencing Phi near 1
    would turn every upper-tail mass under 1e-16 into a multiple of 2^-53 or into 0.
    """
    if not sigma > 0:
        raise ConfigError("workload.input.sigma", sigma, "must be positive")
    if not np.isfinite(mu):
        raise ConfigError("workload.input.mu", mu, "must be a finite number")
    if not 0 < min_tokens <= max_tokens:
        raise ConfigError("workload.input.min_tokens", min_tokens,
                          f"must be positive and <= max_tokens ({max_tokens})")
    name = f"lognormal(mu={mu}, sigma={sigma}) on [{min_tokens}, {max_tokens}]"
    if min_tokens == max_tokens:  # truncated to one length: all the mass is there
        return LengthDistribution(min_tokens, np.ones(1), name)
    lengths = np.arange(min_tokens, max_tokens + 1, dtype=float)
    edges = np.concatenate([[min_tokens], lengths[:-1] + 0.5, [max_tokens]])
    edges = np.clip(edges, min_tokens, max_tokens)
    z = (np.log(edges) - mu) / sigma
    below, above = ndtr(z), ndtr(-z)  # Phi(z), Q(z)
    za, zb = z[:-1], z[1:]
    pmf = np.where(zb <= 0, below[1:] - below[:-1],
                   np.where(za >= 0, above[:-1] - above[1:],
                            (0.5 - below[:-1]) + (0.5 - above[1:])))
    if not pmf.sum() > 0:
        raise ConfigError("workload.input", name, "no probability mass on [min_tokens, "
                          "max_tokens] in double precision")
    return LengthDistribution(min_tokens, np.maximum(pmf, 0.0), name)


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
