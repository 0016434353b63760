"""EngineConfig: the small hybrid-attention model's shape and the engine's execution settings.

The layer pattern is a string, one letter per layer: K = KDA-style linear (gated delta rule),
M = MLA (caches the compressed latent + rope key), G = GQA, S = sliding-window GQA. The config
is validated at construction (bad values raise ConfigError naming the field) and never mutated.
`to_spec()` gives the same geometry as a planner ModelSpec (fp32), so `models.kv.geometry` sizes
exactly what `SequenceKV.byte_size()` holds on the wire.

Where it runs: `device` is `cpu` (the default), `cuda` or `cuda:N`; `dtype` `auto` computes in
float32 on the CPU and bfloat16 on a GPU (the KDA recurrence and its state stay float32, as
Kimi Linear keeps them). The wire carries float32 either way (a bf16 value widens exactly);
a link's `wire_dtype: bf16` ships a bf16 engine's KV at 2 bytes a value without loss.
`prefill_chunk_tokens` (0: the block size) is how many tokens a layer takes at once in a
prefill: the block size keeps a resumed prefill bitwise equal to one from scratch; a GPU wants
thousands (docs/decisions.md: the KDA prefill on GPUs). `kda_chunk_tokens` is the KDA
parallel form's inner chunk, bounded by the gate floor (kda.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.models.spec import LayerGroup, ModelSpec

LAYER_KINDS: dict[str, str] = {"K": "linear", "M": "mla", "G": "gqa", "S": "swa"}
KDA_CHUNK_TOKENS = 64  # inner chunk of the KDA parallel form; bounded by the gate floor below
MAX_KDA_CHUNK_TOKENS = 64  # e^{64 * 1.0} (gate floor -1 per token) stays inside fp32
CONV_KERNEL = 4  # KDA short causal convolution over q/k/v, as in Kimi Linear
DTYPES = ("auto", "fp32", "bf16")
# fields that say where and in what precision a model runs, not which model it is (a worker's
# manifest identity leaves them out: a bf16 GPU prefill and an fp32 CPU decoder serve one model)
PLACEMENT_FIELDS = ("device", "dtype")


def check_device(device: object, where: str = "engine.device") -> str:
    """`cpu`, `cuda` or `cuda:N` (N >= 0), else a ConfigError naming `where`."""
    text = str(device)
    if text in ("cpu", "cuda"):
        return text
    if text.startswith("cuda:") and text[5:].isdigit():
        return f"cuda:{int(text[5:])}"
    raise ConfigError(where, device, "must be cpu, cuda or cuda:N")


def device_index(device: str) -> int | None:
    """The GPU index a device names (cuda: 0), None for cpu."""
    if device == "cpu":
        return None
    return int(device[5:]) if device.startswith("cuda:") else 0


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
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp32 on cpu, bf16 on cuda) | fp32 | bf16
    prefill_chunk_tokens: int = 0  # tokens a layer takes at once in a prefill; 0: block size
    kda_chunk_tokens: int = KDA_CHUNK_TOKENS

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
        if self.device != check_device(self.device):
            raise ConfigError("engine.device", self.device, f"write {check_device(self.device)}")
        if self.dtype not in DTYPES:
            raise ConfigError("engine.dtype", self.dtype, f"must be one of {', '.join(DTYPES)}")
        if self.prefill_chunk_tokens < 0 or self.prefill_chunk_tokens % self.block_size_tokens:
            raise ConfigError("engine.prefill_chunk_tokens", self.prefill_chunk_tokens,
                              f"must be 0 (the block size) or a multiple of "
                              f"block_size_tokens={self.block_size_tokens}")
        if not 0 < self.kda_chunk_tokens <= MAX_KDA_CHUNK_TOKENS:
            raise ConfigError("engine.kda_chunk_tokens", self.kda_chunk_tokens,
                              f"must be in [1, {MAX_KDA_CHUNK_TOKENS}] (the gate floor bounds it)")

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

    @classmethod
    def kimi_linear(cls, **overrides: Any) -> EngineConfig:
        """Kimi-Linear-48B-A3B's attention geometry (HF moonshotai/Kimi-Linear-48B-A3B-Instruct
        config.json): hidden 2304, 27 layers with MLA at layers 4, 8, ..., 24 and 27 (7 MLA,
        20 KDA: 3:1), 32 heads of 128, KDA state 32x128x128, MLA latent 512 + rope key 64 =
        576, vocabulary 163,840. Its MoE (8 of 256 experts of 1024 plus one shared) becomes a
        dense SwiGLU of 9 x 1024 = 9216, the same active feed-forward parameters per token, so
        the model computes ~3.3B parameters a token like the real one's ~3B: a GPU profile of
        it measures compute of that size. Random weights, byte tokens. ~3.7B parameters: 7.3 GB
        in bf16; tests use it at tiny token counts or a scaled copy. Made for a GPU
        (`device: cuda`): 8192-token prefill chunks (a layer's matmuls are large, its launches
        few), linear-state snapshots at chunk ends (2 MiB per KDA layer each), 128K context."""
        base: dict[str, Any] = {
            "vocab_size": 163840, "hidden": 2304, "layer_pattern": "KKKM" * 6 + "KKM",
            "num_heads": 32, "head_dim": 128, "kv_lora_rank": 512,
            "rope_head_dim": 64, "mlp_hidden": 9216, "gate_rank": 128,
            "block_size_tokens": 64, "snapshot_every_blocks": 128,
            "max_context_tokens": 131072, "prefill_chunk_tokens": 8192,
            "name": "prfaas-kimi-linear-48b-a3b-like"}
        return cls(**{**base, **overrides})

    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    @property
    def compute_dtype(self) -> str:
        """fp32 or bf16: `dtype`, with auto resolved by the device."""
        if self.dtype != "auto":
            return self.dtype
        return "fp32" if self.device == "cpu" else "bf16"

    @property
    def chunk_tokens(self) -> int:
        """Tokens a layer takes at once in a prefill (prefill_chunk_tokens, 0: the block)."""
        return self.prefill_chunk_tokens or self.block_size_tokens

    def identity_fields(self) -> dict[str, Any]:
        """Every field but where and how precisely it runs (PLACEMENT_FIELDS)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in PLACEMENT_FIELDS}

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
