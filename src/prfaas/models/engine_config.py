"""EngineConfig: the small hybrid-attention model's shape and the engine's execution settings.

The layer pattern is a string, one letter per layer: K = KDA-style linear (gated delta rule),
M = MLA (caches the compressed latent + rope key), G = GQA, S = sliding-window GQA. The config
is validated at construction (bad values raise ConfigError naming the field) and never mutated.
`to_spec()` gives the same geometry as a planner ModelSpec (fp32), so `models.kv.geometry` sizes
exactly what `SequenceKV.byte_size()` holds on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.models.spec import LayerGroup, ModelSpec

LAYER_KINDS: dict[str, str] = {"K": "linear", "M": "mla", "G": "gqa", "S": "swa"}
KDA_CHUNK_TOKENS = 64  # inner chunk of the KDA parallel form; bounded by the gate floor below
CONV_KERNEL = 4  # KDA short causal convolution over q/k/v, as in Kimi Linear


@dataclass(frozen=True, slots=True)
class EngineConfig:
    vocab_size: int = 258  # 256 bytes + BOS + EOS
    hidden: int = 256
    layer_pattern: str = "KKKM" * 3  # Kimi-Linear-like KDA:MLA = 3:1, 12 layers
    num_heads: int = 4
    head_dim: int = 64  # q/k/v head dim (MLA: the no-rope part of q/k and v)
    num_kv_heads: int = 2  # GQA / SWA
    kv_lora_rank: int = 128  # MLA latent
    rope_head_dim: int = 32  # MLA shared rope key
    window: int = 256  # SWA window, tokens
    mlp_hidden: int = 768
    gate_rank: int = 16  # KDA low-rank forget-gate projection
    block_size_tokens: int = 64  # paged KV block = prefill chunk = snapshot granularity
    snapshot_every_blocks: int = 1  # linear-state snapshots at every n-th block boundary
    max_context_tokens: int = 16384
    rope_theta: float = 10000.0
    seed: int = 0  # the random init's seed (weights: seed)
    # "seed": random init from `seed`; "trained": the shipped weights of this config's `name`
    # (engine/weights.py; the presets `tiny` and `mimo_like` default to them); else a
    # safetensors file with exactly this model's names and shapes
    weights: str = "seed"
    threads: int = 1  # torch intra-op threads; 1 keeps batched decode bitwise batch-invariant
    name: str = "prfaas-tiny-kda"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"engine.{f.name}", value, "must be an integer")
        positive = ("vocab_size", "hidden", "num_heads", "head_dim", "num_kv_heads",
                    "kv_lora_rank", "rope_head_dim", "window", "mlp_hidden", "gate_rank",
                    "block_size_tokens", "snapshot_every_blocks", "max_context_tokens", "threads")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"engine.{key}", getattr(self, key), "must be positive")
        if not isinstance(self.weights, str) or not self.weights:
            raise ConfigError("engine.weights", self.weights,
                              "must be `seed`, `trained` or a safetensors path")
        if self.vocab_size < 258:
            raise ConfigError("engine.vocab_size", self.vocab_size,
                              "needs >= 258 (bytes + BOS/EOS)")
        if not self.layer_pattern or set(self.layer_pattern) - set(LAYER_KINDS):
            raise ConfigError("engine.layer_pattern", self.layer_pattern,
                              "letters K (kda), M (mla), G (gqa), S (swa) only")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("engine.num_kv_heads", self.num_kv_heads, "must divide num_heads")
        for key in ("head_dim", "rope_head_dim"):
            if getattr(self, key) % 2:
                raise ConfigError(f"engine.{key}", getattr(self, key), "must be even (rope)")
        if self.max_context_tokens % self.block_size_tokens:
            raise ConfigError("engine.max_context_tokens", self.max_context_tokens,
                              f"must be a multiple of block_size_tokens={self.block_size_tokens}")

    @classmethod
    def tiny(cls, **overrides: Any) -> EngineConfig:
        """The default: hidden 256, 12 layers, KDA:MLA 3:1 (Kimi-Linear-like), trained weights
        (another shape needs `weights="seed"`: there are no trained weights for it)."""
        return cls(**{"weights": "trained", **overrides})

    @classmethod
    def mimo_like(cls, **overrides: Any) -> EngineConfig:
        """SWA:GQA 5:1 (MiMo-V2-Flash-like), 12 layers."""
        base: dict[str, Any] = {"layer_pattern": "SSSSSG" * 2, "name": "prfaas-tiny-swa",
                                "weights": "trained"}
        return cls(**{**base, **overrides})

    @classmethod
    def small(cls, **overrides: Any) -> EngineConfig:
        """A larger preset: hidden 512, 12 layers, KDA:MLA 3:1."""
        base: dict[str, Any] = {"hidden": 512, "layer_pattern": "KKKM" * 3, "num_heads": 8,
                                "mlp_hidden": 1536, "kv_lora_rank": 256,
                                "name": "prfaas-small-kda"}
        return cls(**{**base, **overrides})

    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    def kind_of(self, layer_index: int) -> str:
        return LAYER_KINDS[self.layer_pattern[layer_index]]

    @property
    def conv_channels(self) -> int:
        return 3 * self.num_heads * self.head_dim

    def to_spec(self) -> ModelSpec:
        """The model's KV geometry as a planner spec (layer groups in models.json form, fp32)."""
        groups: list[LayerGroup] = []
        for letter in dict.fromkeys(self.layer_pattern):  # first-seen order, one group per kind
            count = self.layer_pattern.count(letter)
            groups.append(self._group(LAYER_KINDS[letter], count))
        return ModelSpec(name=self.name, layers=tuple(groups), dtype="fp32", state_dtype="fp32",
                         source="prfaas.engine.EngineConfig", notes=f"pattern {self.layer_pattern}")

    def _group(self, kind: str, count: int) -> LayerGroup:
        if kind == "linear":
            return LayerGroup(kind="linear", count=count, heads=self.num_heads,
                              k_head_dim=self.head_dim, v_head_dim=self.head_dim,
                              conv_channels=self.conv_channels, conv_kernel=CONV_KERNEL,
                              variant="kda")
        if kind == "mla":
            return LayerGroup(kind="mla", count=count, kv_lora_rank=self.kv_lora_rank,
                              rope_head_dim=self.rope_head_dim, q_heads=self.num_heads)
        window = self.window if kind == "swa" else 0
        return LayerGroup(kind=kind, count=count, kv_heads=self.num_kv_heads,  # type: ignore[arg-type]
                          k_head_dim=self.head_dim, v_head_dim=self.head_dim, window=window,
                          q_heads=self.num_heads)
