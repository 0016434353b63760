"""Measured profile files (written by `prfaas profile`, or by hand from any engine's numbers).

Format (YAML):

    name: cpu-tiny-kimi            # free text
    hardware: "<cpu/gpu>, <threads>"
    model: <spec name>
    how: "<how it was measured>"
    gpus_per_instance: 1
    prefill: {points: [{length_tokens, time_s}, ...]}      # >= 3 points, quadratic fit
    kv: {points: [{length_tokens, bytes}, ...]}            # >= 2 points, linear fit
    decode: {bs_max, step_points: [{batch, step_s}, ...]}  # optional
    idle_ttft: {how, points: [{route, length_tokens, ttft_s, prefill_s?, kv_bytes?,
                          kv_wire_bytes?}, ...]}  # optional:
                                   # a deployment's idle TTFT per route (experiments/idle_routes.py)
    core_sharing: {how, factor, points: [...]}  # optional: each of two concurrent prefills on
                                   # instances pinned to one core takes `factor` x its time
                                   # alone (integrations/vllm/core_sharing.py, sim/sharing.py)

A scenario refers to one with `hardware: {<hw>: {profile: PATH}}` and `kv: {profile: PATH}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.core.files import read_structured
from prfaas.models.profile import DecodeTime, HardwareProfile, KVSize, PrefillTime

_KEYS = {"name", "hardware", "model", "how", "gpus_per_instance", "prefill", "kv", "decode",
         "notes", "idle_ttft", "core_sharing"}


def read_profile_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    raw = read_structured(p, "profile")
    if not isinstance(raw, dict):
        raise ConfigError("profile", str(path), "expected a mapping")
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(f"profile.{key}", raw[key], f"unknown key in {p.name}")
    return raw


def _points(raw: dict[str, Any], section: str, x: str, y: str, where: str
            ) -> tuple[list[float], list[float]]:
    block = raw.get(section)
    points = block.get("points") if isinstance(block, dict) else None
    if not isinstance(points, list) or not points:
        raise ConfigError(f"{where}.{section}.points", points, "missing or empty")
    try:
        return [float(p[x]) for p in points], [float(p[y]) for p in points]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}.{section}.points", points,
                          f"each point needs numeric {x} and {y}") from None


def kv_from_profile(path: str | Path) -> KVSize:
    raw = read_profile_file(path)
    xs, ys = _points(raw, "kv", "length_tokens", "bytes", str(path))
    return KVSize.fit(xs, ys, f"measured: {raw.get('name', path)}")


def load_profile_file(path: str | Path, kv: KVSize | None = None) -> HardwareProfile:
    """A HardwareProfile from a profile file; `kv` overrides the file's KV points."""
    raw = read_profile_file(path)
    where = str(path)
    xs, ys = _points(raw, "prefill", "length_tokens", "time_s", where)
    prefill = PrefillTime.fit(xs, ys, f"measured: {raw.get('name', path)}")
    decode = None
    if isinstance(raw.get("decode"), dict):
        d = raw["decode"]
        steps = tuple((int(p["batch"]), float(p["step_s"])) for p in d.get("step_points", []))
        bs_max = int(d.get("bs_max", max((b for b, _ in steps), default=1)))
        step = float(d.get("step_s", dict(steps).get(bs_max, steps[-1][1] if steps else 0.0)))
        decode = DecodeTime(bs_max, step, tuple(sorted(steps)), f"measured: {raw.get('name')}")
    return HardwareProfile(str(raw.get("name", Path(path).stem)),
                           int(raw.get("gpus_per_instance", 1)), prefill, decode,
                           kv or kv_from_profile(path), str(raw.get("how", "")))


def idle_ttft_points(path: str | Path) -> list[dict[str, Any]]:
    """The profile's idle-deployment TTFT points (empty when it has none)."""
    raw = read_profile_file(path)
    block = raw.get("idle_ttft")
    points = block.get("points") if isinstance(block, dict) else None
    if block is None:
        return []
    if not isinstance(points, list):
        raise ConfigError(f"{path}.idle_ttft.points", points, "expected a list")
    out = []
    for p in points:
        try:
            out.append({"route": str(p["route"]), "length_tokens": int(p["length_tokens"]),
                        "ttft_s": float(p["ttft_s"]),
                        **({"prefill_s": float(p["prefill_s"])} if "prefill_s" in p else {}),
                        **{k: int(p[k]) for k in ("kv_bytes", "kv_wire_bytes") if k in p}})
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}.idle_ttft.points", p,
                              "each point needs route, length_tokens and ttft_s") from None
    return out


def check_core_share_factor(factor: object, name: str = "core_share_factor") -> float:
    """A slowdown of two concurrent prefills on shared cores: a number in [1, 16] (the one
    rule for the profile's measured factor and the simulator's `core_share_factor`)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not 1.0 <= factor <= 16.0:
        raise ConfigError(name, factor,
                          "expected a slowdown of two concurrent prefills between 1 and 16")
    return float(factor)


def core_sharing_factor(path: str | Path) -> float | None:
    """The profile's measured slowdown of two concurrent prefills on shared cores (None when
    it has none)."""
    block = read_profile_file(path).get("core_sharing")
    if block is None:
        return None
    factor = block.get("factor") if isinstance(block, dict) else None
    return check_core_share_factor(factor, f"{path}.core_sharing.factor")
