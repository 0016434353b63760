"""KVCache bytes from geometry.

- gqa: per token per layer kv_heads * (k_head_dim + v_head_dim) elements of `dtype`.
- mla: per token per layer (kv_lora_rank + rope_head_dim) elements (the compressed latent and
  the shared rope key: what MLA models actually cache).
- swa: like gqa, but holds min(length, window) tokens.
- linear: a fixed recurrent state of heads * k_head_dim * v_head_dim elements of `state_dtype`,
  plus a conv state of conv_channels * (conv_kernel - 1) elements of the KV `dtype` when
  present (vLLM keeps the short-conv state in the model's cache dtype and only the recurrent
  state in the higher-precision state dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.models.spec import DTYPE_BYTES, LayerGroup, ModelSpec


def _per_token_elems(g: LayerGroup) -> int:
    if g.kind in ("gqa", "swa"):
        return g.kv_heads * (g.k_head_dim + g.v_head_dim)
    if g.kind == "mla":
        return g.kv_lora_rank + g.rope_head_dim
    return 0


def _recurrent_state_elems(g: LayerGroup) -> int:
    return g.heads * g.k_head_dim * g.v_head_dim


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

    @property
    def state_bytes(self) -> float:
        """Fixed per-sequence bytes: linear state plus SWA windows when full."""
        return self.linear_state_bytes + self.swa_full_bytes

    def size_bytes(self, length_tokens: float) -> float:
        """S_kv(l): bytes of the whole KVCache of a sequence of `length_tokens` tokens."""
        return (self.kv_bytes_per_token * length_tokens + self.linear_state_bytes
                + self.swa_bytes(length_tokens))

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
    )
