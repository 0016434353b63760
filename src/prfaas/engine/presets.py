"""Named EngineConfig presets, for the CLI and worker configs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prfaas.core.errors import UnknownNameError
from prfaas.models.engine_config import EngineConfig

PRESETS: dict[str, Callable[..., EngineConfig]] = {
    "tiny": EngineConfig.tiny,
    "small": EngineConfig.small,
    "mimo-like": EngineConfig.mimo_like,
    "kimi-linear": EngineConfig.kimi_linear,
}


def engine_config(preset: str = "tiny", **overrides: Any) -> EngineConfig:
    """A preset with overrides (None values are ignored)."""
    if preset not in PRESETS:
        raise UnknownNameError("preset", preset, list(PRESETS))
    return PRESETS[preset](**{k: v for k, v in overrides.items() if v is not None})
