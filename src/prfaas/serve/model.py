"""The engine a topology names: `model: {preset: tiny|small|mimo_like, <EngineConfig fields>}`."""

from __future__ import annotations

from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.engine import EngineConfig

PRESETS = ("tiny", "small", "mimo_like")


def engine_config(model: dict[str, Any]) -> EngineConfig:
    fields = dict(model)
    preset = str(fields.pop("preset", "tiny"))
    if preset not in PRESETS:
        raise ConfigError("model.preset", preset, f"unknown; known: {', '.join(PRESETS)}")
    try:
        config: EngineConfig = getattr(EngineConfig, preset)(**fields)
    except TypeError as exc:
        raise ConfigError("model", sorted(fields), f"not EngineConfig fields: {exc}") from exc
    return config
