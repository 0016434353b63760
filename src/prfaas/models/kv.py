"""KVCache bytes from geometry.

- gqa: per token per layer kv_heads * (k_head_dim + v_head_dim) elements of `dtype`.
- mla: per token per layer (kv_lora_rank + rope_head_dim) elements (the compressed latent and
  the shared rope key: what MLA models actually cache).
- swa: like gqa, but holds min(length, window) tokens.
- linear: a fixed recurrent state of heads * k_head_dim * v_head_dim elements of `state_dtype`,
  plus a conv state of conv_channels * (conv_kernel - 1) elements of the KV `dtype` when
  present (vLLM keeps the short-conv state in the model's cache dtype and only the recurrent
  state in the higher-precision state dtype).

On the wire (`KVGeometry.on_wire`): the full-attention KV may travel as bf16 or as fp8 (e4m3)
with one fp32 scale per block of `WIRE_SCALE_BLOCK_TOKENS` tokens per vector (a head's K or V,
an MLA latent or rope key); linear states and SWA windows keep their dtype (docs/wire-format.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prfaas.core.errors import ConfigError
from prfaas.models.spec import DTYPE_BYTES, LayerGroup, ModelSpec

WIRE_DTYPES = ("bf16", "fp8_e4m3")
WIRE_ALIASES = {"fp8": "fp8_e4m3"}
WIRE_SCALE_BLOCK_TOKENS = 16  # one fp8 scale per 16 tokens of one vector (transport/quant.py)
WIRE_SCALE_BYTES = 4  # fp32
_WIRE_ELEM_BYTES = {"bf16": 2, "fp8_e4m3": 1}
# A fitted KV profile has no geometry: its per-token slope is taken as full-attention KV in
# vectors of this many elements (the smallest head dim in the catalog, so the scale overhead
# is an upper bound).
FIT_VECTOR_ELEMS = 64


def wire_dtype_name(value: str | None) -> str | None:
    """The canonical wire dtype (`fp8` -> `fp8_e4m3`); None (the cache dtype) stays None."""
    if value is None:
        return None
    name = WIRE_ALIASES.get(str(value), str(value))
    if name not in WIRE_DTYPES:
        raise ConfigError("link.wire_dtype", value,
                          f"unknown; known: {', '.join(WIRE_DTYPES)} (or fp8)")
    return name


def wire_bytes_per_elem(wire_dtype: str, vector_elems: float) -> float:
    """Bytes per full-attention element on the wire, the fp8 scales amortised over their block
    of `WIRE_SCALE_BLOCK_TOKENS` rows of `vector_elems` elements."""
    elem = float(_WIRE_ELEM_BYTES[wire_dtype])
    if wire_dtype == "fp8_e4m3":
        elem += WIRE_SCALE_BYTES / (WIRE_SCALE_BLOCK_TOKENS * vector_elems)
    return elem


def _per_token_elems(g: LayerGroup) -> int:
    if g.kind in ("gqa", "swa"):
        return g.kv_heads * (g.k_head_dim + g.v_head_dim)
    if g.kind == "mla":
        return g.kv_lora_rank + g.rope_head_dim
    return 0


def _recurrent_state_elems(g: LayerGroup) -> int:
    return g.heads * g.k_head_dim * g.v_head_dim


def _vectors_per_token(g: LayerGroup) -> int:
    """Quantisation vectors per token per layer: each head's K and V, or MLA's latent and rope."""
    return 2 * g.kv_heads if g.kind in ("gqa", "swa") else 2 if g.kind == "mla" else 0


def _conv_state_elems(g: LayerGroup) -> int:
    return g.conv_channels * (g.conv_kernel - 1) if g.conv_channels else 0


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Byte sizes of one model's KVCache, per sequence."""

    model: str
    kv_bytes_per_token: float  # full-attention layers (gqa + mla), all layers together
    linear_state_bytes: float  # recurrent + conv state of all linear layers
    swa_bytes_per_token: float  # all swa layers, per cached token
    swa_window_tokens: int  # the largest window (0 when there is no swa layer)
    swa_full_bytes: float  # all swa layers with their windows full
    swa_groups: tuple[tuple[float, int], ...] = ()  # (bytes per token, window) per swa group
    full_elems_per_token: int = 0  # full-attention elements per token, all layers together
    full_vectors_per_token: int = 0  # their quantisation vectors (one scale each per block)
    wire_dtype: str | None = None  # None: the full-attention KV travels in its cache dtype

    @property
    def state_bytes(self) -> float:
        """Fixed per-sequence bytes: linear state plus SWA windows when full."""
        return self.linear_state_bytes + self.swa_full_bytes

    def size_bytes(self, length_tokens: float) -> float:
        """S_kv(l): bytes of the whole KVCache of a sequence of `length_tokens` tokens."""
        return (self.kv_bytes_per_token * length_tokens + self.linear_state_bytes
                + self.swa_bytes(length_tokens))

    def on_wire(self, wire_dtype: str | None) -> KVGeometry:
        """The geometry of what crosses the link with full-attention KV in `wire_dtype` (scales
        included); linear states and SWA windows keep their dtype. None: unchanged."""
        name = wire_dtype_name(wire_dtype)
        if name is None:
            return self
        if not self.full_vectors_per_token and self.kv_bytes_per_token:
            raise ConfigError("link.wire_dtype", wire_dtype,
                              f"{self.model}: geometry without full-attention vector counts")
        vector = self.full_elems_per_token / max(self.full_vectors_per_token, 1)
        per_elem = wire_bytes_per_elem(name, vector)
        if self.full_elems_per_token * per_elem >= self.kv_bytes_per_token:
            return self  # not narrower than the cache dtype: the KV travels as cached
        return replace(self, kv_bytes_per_token=self.full_elems_per_token * per_elem,
                       wire_dtype=name)

    def scaled(self, factor: float) -> KVGeometry:
        """Every byte size times `factor` (a lossless codec on the wire); element and vector
        counts unchanged, so `on_wire` must come first."""
        return replace(self, kv_bytes_per_token=self.kv_bytes_per_token * factor,
                       linear_state_bytes=self.linear_state_bytes * factor,
                       swa_bytes_per_token=self.swa_bytes_per_token * factor,
                       swa_full_bytes=self.swa_full_bytes * factor,
                       swa_groups=tuple((b * factor, w) for b, w in self.swa_groups))

    def swa_bytes(self, length_tokens: float) -> float:
        """SWA bytes held at `length_tokens`: each group keeps min(length, its window)."""
        return sum(per_tok * min(length_tokens, window) for per_tok, window in self.swa_groups)


def geometry(spec: ModelSpec, dtype: str | None = None) -> KVGeometry:
    """Compute the KV geometry of `spec`, optionally with the KV dtype overridden."""
    kv_dtype_bytes = DTYPE_BYTES[dtype or spec.dtype]
    state_dtype_bytes = DTYPE_BYTES[spec.state_dtype]
    full = sum(g.count * _per_token_elems(g) for g in spec.layers if g.is_full_attention)
    linear_groups = [g for g in spec.layers if g.kind == "linear"]
    recurrent = sum(g.count * _recurrent_state_elems(g) for g in linear_groups)
    conv = sum(g.count * _conv_state_elems(g) for g in linear_groups)
    swa_groups = tuple(
        (g.count * _per_token_elems(g) * kv_dtype_bytes, g.window)
        for g in spec.layers if g.kind == "swa"
    )
    return KVGeometry(
        model=spec.name,
        kv_bytes_per_token=full * kv_dtype_bytes,
        linear_state_bytes=recurrent * state_dtype_bytes + conv * kv_dtype_bytes,
        swa_bytes_per_token=sum(b for b, _ in swa_groups),
        swa_window_tokens=max((w for _, w in swa_groups), default=0),
        swa_full_bytes=sum(b * w for b, w in swa_groups),
        swa_groups=swa_groups,
        full_elems_per_token=full,
        full_vectors_per_token=sum(g.count * _vectors_per_token(g) for g in spec.layers
                                   if g.is_full_attention),
    )
