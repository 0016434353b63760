"""Shared factories for the engine tests: cached engines per preset, deterministic prompts."""

from __future__ import annotations

from functools import cache

import torch

from prfaas.engine import Engine, EngineConfig

# kimi: the shipped preset with its trained weights; the two smaller shapes have none (seeded)
PATTERNS = {
    "kimi": EngineConfig.tiny(),
    "mimo": EngineConfig.mimo_like(window=100, layer_pattern="SSG", weights="seed"),
    "mixed": EngineConfig.tiny(layer_pattern="KGSM", window=80, weights="seed"),
}


@cache
def engine(name: str = "kimi") -> Engine:
    return Engine(PATTERNS[name])


def prompt(length: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [256, *torch.randint(0, 256, (length - 1,), generator=gen).tolist()]
