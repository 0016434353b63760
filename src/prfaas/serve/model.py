"""The engine a topology names: `model: {preset: tiny|small|mimo_like, <EngineConfig fields>}`,
or `model: {backend: emulated, scenario, system, scales}` (prfaas.emulated: compute time from
a scenario's hardware profiles)."""

from __future__ import annotations

from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.engine import Engine, EngineConfig
from prfaas.models.kv import KVGeometry, geometry
from prfaas.models.profile import PrefillTime

PRESETS = ("tiny", "small", "mimo_like")


def engine_config(model: dict[str, Any]) -> EngineConfig:
    if model.get("backend") == "emulated":
        from prfaas.emulated.backend import emulated_config, scaled_from_model

        return emulated_config(scaled_from_model(model)[0])
    fields = dict(model)
    preset = str(fields.pop("preset", "tiny"))
    if preset not in PRESETS:
        raise ConfigError("model.preset", preset, f"unknown; known: {', '.join(PRESETS)}")
    try:
        config: EngineConfig = getattr(EngineConfig, preset)(**fields)
    except TypeError as exc:
        raise ConfigError("model", sorted(fields), f"not EngineConfig fields: {exc}") from exc
    return config


def make_engine(model: dict[str, Any], role: str) -> Engine:
    """The engine one worker of `role` runs (the emulated one takes its role's hardware)."""
    if model.get("backend") == "emulated":
        from prfaas.emulated.backend import emulated_engine

        return emulated_engine(model, role)
    return Engine(engine_config(model))


def kv_geometry(model: dict[str, Any], config: EngineConfig) -> KVGeometry:
    """The KV geometry the router predicts transfer bytes with (the emulated layout's bytes
    for the emulated backend)."""
    if model.get("backend") == "emulated":
        from prfaas.emulated.backend import scaled_from_model

        kv = scaled_from_model(model)[0].layout.kv_size()
        return KVGeometry(config.name, kv.per_token_bytes, kv.fixed_bytes, 0.0, 0, 0.0)
    return geometry(config.to_spec())


def prefill_models(topology: Any) -> dict[str, PrefillTime]:
    """Known prefill cost models by worker name, the router's prior for each prefill worker's
    service time: an emulated worker's is its role's hardware profile (what it sleeps, in live
    units), the one the simulator's router reads. Other engines have none: the router then
    learns a seconds-per-token rate from their reports (serve/router/cluster.py)."""
    if topology.model.get("backend") != "emulated":
        return {}
    from prfaas.emulated.backend import hardware_for, scaled_from_model

    scaled, system = scaled_from_model(topology.model)
    return {w.name: hardware_for(scaled, system, w.role).require_prefill()
            for w in topology.workers if w.is_prefill}
