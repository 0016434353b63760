"""ModelCard: what the router knows of the served model, without its weights or torch.

The router tokenizes, hashes blocks, predicts KV bytes and answers /v1/models; it needs the
model's name, context and block size and its KV geometry, nothing that computes. Every engine
backend gives one (serve/engines.py): the native engine's from its EngineConfig, the emulated
one's from its layout, vLLM's from the served model's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.errors import ConfigError
from prfaas.models.kv import KVGeometry

MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI's chat top_logprobs limit


@dataclass(frozen=True, slots=True)
class ModelCard:
    name: str
    max_context_tokens: int
    block_size_tokens: int  # the router's prefix-hash block = the workers' cache block
    kv: KVGeometry  # what one request's KV weighs on the wire (the router's transfer estimate)

    def __post_init__(self) -> None:
        if self.max_context_tokens < 1:
            raise ConfigError("max_context_tokens", self.max_context_tokens, "must be >= 1")
        if self.block_size_tokens < 1:
            raise ConfigError("block_size_tokens", self.block_size_tokens, "must be >= 1")
