"""The native engine backend (`engine: native`, the default): prfaas' own workers running
the small hybrid-attention torch model, `model: {preset: tiny|small|mimo_like, <EngineConfig
fields>}`. torch is imported only by `worker_engine`, in the worker processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prfaas.core.errors import ConfigError
from prfaas.models.card import ModelCard
from prfaas.models.engine_config import EngineConfig
from prfaas.models.kv import geometry
from prfaas.serve.engines import EngineBackend

if TYPE_CHECKING:
    from prfaas.engine.base import EngineBase

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


def config_card(config: EngineConfig) -> ModelCard:
    return ModelCard(config.name, config.max_context_tokens, config.block_size_tokens,
                     geometry(config.to_spec()))


class NativeEngineBackend(EngineBackend):
    name = "native"
    wire_dtypes = ("bf16", "fp8_e4m3")  # serve/worker/kvship.py encodes full-attention KV

    def card(self) -> ModelCard:
        return config_card(engine_config(self.topology.model))

    def worker_engine(self, name: str) -> EngineBase:
        from prfaas.engine.engine import Engine

        return Engine(engine_config(self.topology.model))
