"""The emulated model's layers and their bytes.

A layer is `K` (linear: a fixed state of `width` float32 values) or `M` (full attention: `width`
float32 values per token). With a `model:` in the scenario the pattern keeps its linear and
full-attention layer counts (the full-attention layers spread evenly among the linear ones,
as in Kimi Linear and Qwen3-Next), merged into `MAX_LAYERS` = 8 layers of the same linear:full
mix when the model is deeper (every layer costs frames and event-loop wake-ups per request on
two shared cores; the bytes per kind are the model's either way); without one (a KV size
fitted from measurements, like the paper's case study) it is `KKKM` x 2, the paper's
KDA:MLA = 3:1. The scaled KV bytes
(`bytes_scale` x S_kv(tokens_scale x l)) are rounded to whole float32 values, split evenly
over the layers of each kind; `kv_size()` is what the emulated engine really ships, so the
simulator of the scaled scenario uses exactly those bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.errors import ConfigError
from prfaas.models.profile import KVSize
from prfaas.models.spec import ModelSpec

FLOAT_BYTES = 4
DEFAULT_PATTERN = "KKKM" * 2
MAX_ROUNDING = 0.01  # a scaled size may be off the exact one by at most 1%
MAX_LAYERS = 8  # deeper models are emulated with 8 layers of the same linear:full mix


@dataclass(frozen=True, slots=True)
class EmulatedLayout:
    pattern: str  # one letter per layer: K linear, M full attention
    widths: tuple[int, ...]  # K: state floats; M: floats per token
    source: str = ""

    @property
    def num_layers(self) -> int:
        return len(self.pattern)

    @property
    def state_floats(self) -> int:
        return sum(w for k, w in zip(self.pattern, self.widths, strict=True) if k == "K")

    @property
    def token_floats(self) -> int:
        return sum(w for k, w in zip(self.pattern, self.widths, strict=True) if k == "M")

    def size_bytes(self, length_tokens: int) -> int:
        return FLOAT_BYTES * (self.state_floats + self.token_floats * length_tokens)

    def kv_size(self) -> KVSize:
        return KVSize(float(FLOAT_BYTES * self.state_floats),
                      float(FLOAT_BYTES * self.token_floats), None,
                      f"emulated layout {self.pattern} ({self.source})")


def pattern_of(model: ModelSpec | None) -> str:
    if model is None:
        return DEFAULT_PATTERN
    kinds = [g.kind for g in model.layers for _ in range(g.count)]
    if "swa" in kinds:
        raise ConfigError("model", model.name, "emulation of sliding-window layers is not "
                          "supported (their KV is neither per token nor fixed)")
    n_lin = kinds.count("linear")
    n_full = len(kinds) - n_lin
    if len(kinds) > MAX_LAYERS:  # every emulated layer a frame pair per request: keep few
        n_full = min(max(round(MAX_LAYERS * n_full / len(kinds)), 1 if n_full else 0),
                     MAX_LAYERS)
        n_lin, kinds = MAX_LAYERS - n_full, ["linear"] * MAX_LAYERS
    if n_full == 0:
        return "K" * n_lin
    # full-attention layer j sits at the end of its even share of the stack
    at = {round((j + 1) * len(kinds) / n_full) - 1 for j in range(n_full)}
    return "".join("M" if i in at else "K" for i in range(len(kinds)))


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _floats(exact_bytes: float, what: str, field: str) -> int:
    floats = round(exact_bytes / FLOAT_BYTES)
    if exact_bytes > 0:
        err = abs(floats * FLOAT_BYTES - exact_bytes) / exact_bytes
        if err > MAX_ROUNDING:
            raise ConfigError(field, f"{exact_bytes:.1f} B {what}",
                              f"rounds to {floats} float32 values ({err:.1%} off, limit "
                              f"{MAX_ROUNDING:.0%}): the link ratio would not be kept; use a "
                              "larger bytes scale")
    return floats


def build_layout(kv: KVSize, model: ModelSpec | None, bytes_scale: float, tokens_scale: int
                 ) -> EmulatedLayout:
    """The layout of `kv` scaled: state bytes x bytes_scale, per-token bytes x bytes_scale x
    tokens_scale (one live token stands for `tokens_scale` scenario tokens)."""
    if kv.geometry is not None and kv.geometry.swa_window_tokens:
        raise ConfigError("kv", kv.source, "emulation of sliding-window KV is not supported")
    pattern = pattern_of(model)
    n_k, n_m = pattern.count("K"), pattern.count("M")
    state = _floats(kv.fixed_bytes * bytes_scale, "of fixed state", "scales.bytes")
    token = _floats(kv.per_token_bytes * bytes_scale * tokens_scale, "per token",
                    "scales.bytes")
    if state and not n_k:
        raise ConfigError("kv", kv.source, f"a fixed state but no linear layer in {pattern}")
    if token and not n_m:
        raise ConfigError("kv", kv.source, f"per-token KV but no attention layer in {pattern}")
    k_widths, m_widths = iter(_split(state, max(n_k, 1))), iter(_split(token, max(n_m, 1)))
    widths = tuple(next(k_widths) if c == "K" else next(m_widths) for c in pattern)
    name = model.name if model is not None else "fitted KV, KDA:MLA 3:1"
    return EmulatedLayout(pattern, widths, name)
