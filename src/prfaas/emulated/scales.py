"""The unit mapping from a scenario to its live emulation, chosen so every stage keeps its
capacity ratio.

One live second is `time` scenario seconds' worth of work scaled down: with
    a = time, b = bytes, d = tokens, g = output,
a scenario request of l input tokens and L_out output tokens becomes a live request of
    l' = round(l / d) tokens and L_out' = L_out / g tokens, and
    T'_prefill(l') = a * T_prefill(d * l')        (c2' = a c2 d^2, c1' = a c1 d, c0' = a c0)
    T'_step(batch) = a * g * T_step(batch)         (BS_max unchanged)
    S'_kv(l')      = b * S_kv(d * l')              (rounded to float32 values, layout.py)
    B'_link        = b / a * B_link                (and the intra-cluster rate likewise)
so a prefill instance's req/s, a decode instance's req/s (BS_max / (T'_step L_out') =
BS_max / (a T_step L_out)) and the link's req/s (B' / S') are each the scenario's divided by a:
every ratio between stages, hence the bottleneck, the planner's split and the capacity ratio
between systems, is the scenario's. Live TTFT and E2E are a x the scenario's (TPOT a g x).
Errors: `g` must divide L_out, the shortest input must stay >= 1 token, and the rounded bytes
must stay within 1% (layout.py); otherwise the ratios cannot be kept and ConfigError says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.emulated.layout import EmulatedLayout, build_layout
from prfaas.models.profile import DecodeTime, HardwareProfile, PrefillTime
from prfaas.scenario import Pool, Scenario
from prfaas.workload.lengths import LengthDistribution


@dataclass(frozen=True, slots=True)
class Scales:
    time: float = 0.2  # live seconds per scenario second of work
    bytes: float = 2e-3  # live bytes per scenario byte (of one scenario token's KV: x tokens)
    tokens: int = 8  # scenario input tokens per live token
    output: int = 64  # scenario output tokens per live output token

    def __post_init__(self) -> None:
        for key in ("time", "bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"scales.{key}", value, "must be a positive number")
        for key in ("tokens", "output"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"scales.{key}", value, "must be a positive integer")

    def to_json(self) -> dict[str, float]:
        return {"time": self.time, "bytes": self.bytes, "tokens": self.tokens,
                "output": self.output}

    @staticmethod
    def from_json(raw: object) -> Scales:
        if raw is None:
            return Scales()
        if not isinstance(raw, dict):
            raise ConfigError("scales", raw, "must be a mapping {time, bytes, tokens, output}")
        unknown = sorted(set(raw) - {"time", "bytes", "tokens", "output"})
        if unknown:
            raise ConfigError(f"scales.{unknown[0]}", raw[unknown[0]],
                              "unknown; known: time, bytes, tokens, output")
        return Scales(**raw)


@dataclass(frozen=True)
class ScaledScenario:
    scenario: Scenario  # in live units: the emulated workers and the simulator both use it
    original: Scenario
    scales: Scales
    layout: EmulatedLayout

    def live_threshold(self, threshold_tokens: int | None) -> int | None:
        return None if threshold_tokens is None else round(threshold_tokens / self.scales.tokens)


def scale_lengths(lengths: LengthDistribution, tokens: int) -> LengthDistribution:
    """The pmf of round(L / tokens) (exact: each scenario length's mass moves to its bin)."""
    if lengths.lo / tokens < 0.5:
        raise ConfigError("scales.tokens", tokens, f"the shortest input ({lengths.lo} tokens) "
                          "would round to 0 live tokens")
    if tokens == 1:
        return lengths
    bins = np.floor(lengths.support / tokens + 0.5).astype(np.int64)
    lo = int(bins[0])
    pmf = np.bincount(bins - lo, weights=lengths.pmf).astype(float)
    return LengthDistribution(lo, pmf, f"{lengths.name} / {tokens}")


def _prefill(p: PrefillTime | None, sc: Scales) -> PrefillTime | None:
    if p is None:
        return None
    a, d = sc.time, sc.tokens
    return PrefillTime(p.c2 * a * d * d, p.c1 * a * d, p.c0 * a,
                       f"emulated: {a} x T({d} l) of {p.source}")


def _decode(dt: DecodeTime | None, sc: Scales) -> DecodeTime | None:
    if dt is None:
        return None
    f = sc.time * sc.output
    return DecodeTime(dt.bs_max, dt.step_s * f, tuple((b, s * f) for b, s in dt.batch_points),
                      f"emulated: {f:g} x the step of {dt.source}")


def _link_raw(raw: dict[str, Any], sc: Scales) -> dict[str, Any]:
    link = dict(raw.get("link") or {})
    rate = sc.bytes / sc.time
    for key in ("gbps", "intra_gbps", "per_connection_gbps"):
        if key in link:
            link[key] = float(link[key]) * rate
    sched = link.get("schedule")
    if isinstance(sched, list):
        link["schedule"] = [
            {"start_s": float(p["start_s"]) * sc.time, "gbps": float(p["gbps"]) * rate}
            if isinstance(p, dict) else [float(p[0]) * sc.time, float(p[1]) * rate]
            for p in sched]
    return {**raw, "link": link}


def scale_scenario(s: Scenario, sc: Scales) -> ScaledScenario:
    if s.output_tokens % sc.output:
        raise ConfigError("scales.output", sc.output,
                          f"must divide the scenario's output length ({s.output_tokens} tokens) "
                          "to keep the decode capacity ratio")
    layout = build_layout(s.kv, s.model, sc.bytes, sc.tokens)
    kv = layout.kv_size()
    hardware: dict[str, HardwareProfile] = {
        name: replace(hw, prefill=_prefill(hw.prefill, sc), decode=_decode(hw.decode, sc), kv=kv)
        for name, hw in s.hardware.items()}

    def pool(p: Pool) -> Pool:
        return Pool(hardware[p.hardware.name], p.instances)

    rate = sc.bytes / sc.time
    scaled = replace(
        s, name=f"{s.name} (emulated)", kv=kv, hardware=hardware, prfaas=pool(s.prfaas),
        pd=pool(s.pd), homogeneous=pool(s.homogeneous), naive_prefill=pool(s.naive_prefill),
        naive_decode=pool(s.naive_decode), link_gbps=s.link_gbps * rate,
        intra_gbps=s.intra_gbps * rate, lengths=scale_lengths(s.lengths, sc.tokens),
        output_tokens=s.output_tokens // sc.output,
        t_step_tokens=max(1, round(s.t_step_tokens / sc.tokens)),
        raw=_link_raw(s.raw, sc))
    return ScaledScenario(scaled, s, sc, layout)
