"""Time and size profiles of one model on one kind of instance.

- `PrefillTime`: T_prefill(l) in seconds. Built from measured points by a least-squares fit
  `c2*l^2 + c1*l + c0` (attention is quadratic in l, projections and MLP linear, c0 is fixed
  overhead), or by scaling another profile (the paper's H20 derivation), or from a roofline.
  A prefill that reuses a cached prefix of `cached` tokens is charged
  T(total) - T(cached) + T(0): the new tokens' linear work, their attention to the whole
  context, and one fixed overhead.
- `KVSize`: S_kv(l) bytes, from model geometry or a linear fit of measured points.
- `DecodeTime`: BS_max and the step time (constant or by batch size).
- `HardwareProfile` bundles them for one instance type (P GPUs per instance).

All functions accept numpy arrays so the planner can integrate over length distributions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from prfaas.core.errors import ConfigError
from prfaas.models.kv import FIT_VECTOR_ELEMS, KVGeometry, wire_bytes_per_elem, wire_dtype_name
from prfaas.models.spec import DTYPE_BYTES

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PrefillTime:
    """T(l) = c2*l^2 + c1*l + c0 seconds (l in tokens)."""

    c2: float
    c1: float
    c0: float
    source: str = ""

    @staticmethod
    def fit(lengths_tokens: ArrayLike, times_s: ArrayLike, source: str = "") -> PrefillTime:
        """Least-squares quadratic through measured points (>= 3 points; c2, c1, c0 >= 0)."""
        x = np.asarray(lengths_tokens, dtype=float)
        y = np.asarray(times_s, dtype=float)
        if x.size < 3:
            raise ConfigError("prefill.points", x.size, "need at least 3 measured points to fit")
        if np.any(x <= 0) or np.any(y <= 0):
            raise ConfigError("prefill.points", list(zip(x, y, strict=True)),
                              "lengths and times must be positive")
        # nonnegative least squares keeps the fit physical (no negative overhead/quadratic term)
        from prfaas.models.nnls import nnls

        design = np.stack([x**2, x, np.ones_like(x)], axis=1)
        scale = design.max(axis=0)
        coef = nnls(design / scale, y)
        c2, c1, c0 = (coef / scale).tolist()
        return PrefillTime(c2, c1, c0, source or "quadratic least-squares fit")

    def scaled(self, factor: float, source: str = "") -> PrefillTime:
        """Keep the fixed overhead c0, scale the length-dependent part by `factor`."""
        if factor <= 0:
            raise ConfigError("prefill.scale", factor, "must be positive")
        return PrefillTime(self.c2 * factor, self.c1 * factor, self.c0,
                           source or f"{factor}x the length-dependent part of another profile")

    def time_s(self, length_tokens: ArrayLike) -> FloatArray:
        x = np.asarray(length_tokens, dtype=float)
        return np.asarray(self.c2 * x * x + self.c1 * x + self.c0, dtype=float)

    def seconds(self, total_tokens: float, cached_tokens: float = 0.0) -> float:
        """Service time of one prefill of `total_tokens`, `cached_tokens` of them reused."""
        t, c = float(total_tokens), float(cached_tokens)
        return self.c2 * (t * t - c * c) + self.c1 * (t - c) + self.c0


@dataclass(frozen=True, slots=True)
class KVSize:
    """S_kv(l) = fixed_bytes + per_token_bytes * l (+ SWA window bytes when from geometry)."""

    fixed_bytes: float
    per_token_bytes: float
    geometry: KVGeometry | None = None
    source: str = ""

    @staticmethod
    def from_geometry(geo: KVGeometry) -> KVSize:
        return KVSize(geo.linear_state_bytes, geo.kv_bytes_per_token, geo,
                      f"geometry of {geo.model}")

    @staticmethod
    def fit(lengths_tokens: ArrayLike, sizes_bytes: ArrayLike, source: str = "") -> KVSize:
        x = np.asarray(lengths_tokens, dtype=float)
        y = np.asarray(sizes_bytes, dtype=float)
        if x.size < 2:
            raise ConfigError("kv.points", x.size, "need at least 2 measured points to fit")
        slope, intercept = np.polyfit(x, y, 1)
        return KVSize(max(float(intercept), 0.0), float(slope), None,
                      source or "linear least-squares fit")

    def on_wire(self, wire_dtype: str | None, cache_dtype: str = "bf16") -> KVSize:
        """S_kv(l) on the link with full-attention KV in `wire_dtype` (scales included): the
        per-token term shrinks, the fixed state (linear, SWA) keeps its dtype. A fitted profile
        has no geometry: its slope is taken as `cache_dtype` full-attention KV in vectors of
        FIT_VECTOR_ELEMS elements (models/kv.py)."""
        name = wire_dtype_name(wire_dtype)
        if name is None:
            return self
        if self.geometry is not None:
            geo = self.geometry.on_wire(name)
            return KVSize(self.fixed_bytes, geo.kv_bytes_per_token, geo,
                          f"{self.source}, {name} on the wire")
        ratio = wire_bytes_per_elem(name, FIT_VECTOR_ELEMS) / DTYPE_BYTES[cache_dtype]
        if ratio >= 1:
            return self
        return KVSize(self.fixed_bytes, self.per_token_bytes * ratio, None,
                      f"{self.source}, {name} on the wire")

    def compressed(self, ratio: float, codec: str) -> KVSize:
        """S_kv(l) on a link whose lossless codec shrinks the KV `ratio`x (tensor / wire bytes,
        measured on real KV: models/compression.py). One ratio for every byte, per-token and
        fixed state alike: it was measured on the whole KV as shipped. Apply it last (after
        `on_wire`): it scales bytes, not elements."""
        if not ratio > 0:
            raise ConfigError("link.compression ratio", ratio, "must be positive")
        if ratio == 1.0:
            return self
        geo = None if self.geometry is None else self.geometry.scaled(1.0 / ratio)
        return KVSize(self.fixed_bytes / ratio, self.per_token_bytes / ratio, geo,
                      f"{self.source}, {codec} {ratio:g}x on the wire")

    def size_bytes(self, length_tokens: ArrayLike) -> FloatArray:
        x = np.asarray(length_tokens, dtype=float)
        if self.geometry is not None and self.geometry.swa_window_tokens:
            swa = np.vectorize(self.geometry.swa_bytes, otypes=[float])(x)
            return np.asarray(self.fixed_bytes + self.per_token_bytes * x + swa, dtype=float)
        return np.asarray(self.fixed_bytes + self.per_token_bytes * x, dtype=float)

    def bytes_for(self, length_tokens: float) -> float:
        if self.geometry is None or not self.geometry.swa_window_tokens:
            # the same two IEEE double operations as size_bytes, without numpy's per-call cost
            # (the simulator asks once per request)
            return self.fixed_bytes + self.per_token_bytes * float(length_tokens)
        return float(self.size_bytes(length_tokens))

    def tail_bytes(self, total_tokens: float, cached_tokens: float) -> float:
        """Bytes to ship when the receiver already holds `cached_tokens`: the new tokens' KV
        plus the fixed-size state (which is only valid at the new length)."""
        return self.bytes_for(total_tokens) - self.per_token_bytes * cached_tokens


@dataclass(frozen=True, slots=True)
class DecodeTime:
    """Continuous-batching decode: up to `bs_max` sequences, one token each per step."""

    bs_max: int
    step_s: float  # at full batch
    batch_points: tuple[tuple[int, float], ...] = ()  # (batch, step_s) measured, optional
    source: str = ""

    def __post_init__(self) -> None:
        if self.bs_max <= 0:
            raise ConfigError("decode.bs_max", self.bs_max, "must be a positive integer")
        if self.step_s <= 0:
            raise ConfigError("decode.step_s", self.step_s, "must be positive")

    def step_at(self, batch: int) -> float:
        """Step time at `batch` running sequences (interpolated; constant if no points)."""
        if not self.batch_points:
            return self.step_s
        xs, ys = zip(*self.batch_points, strict=True)
        return float(np.interp(batch, xs, ys))

    def tokens_per_s(self) -> float:
        return self.bs_max / self.step_at(self.bs_max)

    def requests_per_s(self, output_tokens: float) -> float:
        """Eq. 5 per instance: BS_max / (T_decode * L_out)."""
        return self.bs_max / (self.step_at(self.bs_max) * output_tokens)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One instance type running one model."""

    name: str
    gpus_per_instance: int
    prefill: PrefillTime | None
    decode: DecodeTime | None
    kv: KVSize
    notes: str = ""
    cost_per_gpu_hour: float | None = None  # any unit; only ratios are reported

    def require_prefill(self) -> PrefillTime:
        if self.prefill is None:
            raise ConfigError(f"hardware.{self.name}.prefill", None,
                              "this hardware has no prefill profile but is used for prefill")
        return self.prefill

    def require_decode(self) -> DecodeTime:
        if self.decode is None:
            raise ConfigError(f"hardware.{self.name}.decode", None,
                              "this hardware has no decode profile but is used for decode")
        return self.decode

    def kv_throughput_gbps(self, length_tokens: float) -> float:
        """Eq. 1: Phi_kv(l) = S_kv(l) / T_prefill(l), in Gbps."""
        seconds = float(self.require_prefill().time_s(length_tokens))
        return self.kv.bytes_for(length_tokens) * 8 / seconds / 1e9


@dataclass(frozen=True, slots=True)
class MeasuredProfile:
    """What `prfaas profile` measured on one instance, whatever the engine."""

    prefill_s: tuple[tuple[int, float], ...]  # (length_tokens, time_s)
    kv_bytes: tuple[tuple[int, int], ...]  # (length_tokens, bytes)
    decode_step_s: tuple[tuple[int, float], ...]  # (batch, step_s)
    reps: int
    context_tokens: int

    def document(self, name: str, hardware: str, model: str, how: str) -> dict[str, Any]:
        """The profile file scenarios read (`profile_path`), one GPU-equivalent per instance."""
        return {
            "name": name,
            "hardware": hardware,
            "model": model,
            "how": how,
            "gpus_per_instance": 1,
            "prefill": {"points": [{"length_tokens": n, "time_s": round(t, 6)}
                                   for n, t in self.prefill_s]},
            "kv": {"points": [{"length_tokens": n, "bytes": b} for n, b in self.kv_bytes]},
            "decode": {"bs_max": max(b for b, _ in self.decode_step_s),
                       "step_points": [{"batch": b, "step_s": round(t, 6)}
                                       for b, t in self.decode_step_s]},
        }
