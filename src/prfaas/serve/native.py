"""The native engine backend (`engine: native`, the default): prfaas' own workers running
the hybrid-attention torch model, `model: {preset: tiny|small|mimo_like|kimi_linear,
<EngineConfig fields>}`, `device: cuda` among them for GPUs (a worker's own `device` and
`gpus` override it: serve/gpus.py). torch is imported only by `worker_engine`, in the worker
processes."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from prfaas.core.errors import ConfigError
from prfaas.models.card import ModelCard
from prfaas.models.engine_config import EngineConfig
from prfaas.models.kv import geometry
from prfaas.serve.engines import EngineBackend
from prfaas.serve.gpus import gpu_env

if TYPE_CHECKING:
    from prfaas.engine.base import EngineBase

PRESETS = ("tiny", "small", "mimo_like", "kimi_linear")


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
        """Worker `name`'s engine on its device: its `gpus` become this process's
        CUDA_VISIBLE_DEVICES before CUDA starts (so `cuda:N` counts within them); a device
        this machine lacks is a one-line error naming the worker."""
        from prfaas.engine.engine import Engine

        worker = self.topology.worker(name)
        device = self.topology.device_of(worker)
        os.environ.update(gpu_env(worker.gpus, os.environ))
        config = dataclasses.replace(engine_config(self.topology.model), device=device)
        try:
            return Engine(config)
        except ConfigError as exc:
            if exc.field != "engine.device":
                raise
            raise ConfigError(f"workers.{name}.device", device, exc.reason) from None
