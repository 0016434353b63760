"""Model specs: the KV-relevant geometry of a model, in the layer-group format of models.json.

A spec is a name, a KV dtype, a recurrent-state dtype and a list of layer groups of four kinds:
`gqa` and `mla` (full attention: KV grows with length), `swa` (sliding window: holds
min(length, window) tokens) and `linear` (fixed-size recurrent state, plus an optional
causal-conv state). Specs load from YAML or JSON; unknown keys and bad values are rejected
with the field and value named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prfaas.core.errors import ConfigError
from prfaas.core.files import read_structured

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

LayerKind = Literal["gqa", "mla", "swa", "linear"]


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """`count` identical layers of one kind. Fields that a kind does not use stay 0."""

    kind: LayerKind
    count: int
    kv_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    window: int = 0
    heads: int = 0
    conv_channels: int = 0
    conv_kernel: int = 0
    variant: str = ""
    q_heads: int = 0  # optional; used only by the roofline profile's attention cost

    @property
    def is_full_attention(self) -> bool:
        return self.kind in ("gqa", "mla")


_REQUIRED: dict[str, tuple[str, ...]] = {
    "gqa": ("count", "kv_heads", "k_head_dim", "v_head_dim"),
    "mla": ("count", "kv_lora_rank", "rope_head_dim"),
    "swa": ("count", "window", "kv_heads", "k_head_dim", "v_head_dim"),
    "linear": ("count", "heads", "k_head_dim", "v_head_dim"),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "gqa": ("q_heads",),
    "mla": ("q_heads",),
    "swa": ("q_heads",),
    "linear": ("conv_channels", "conv_kernel", "variant"),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: tuple[LayerGroup, ...]
    dtype: str = "bf16"
    state_dtype: str = "fp32"
    aliases: tuple[str, ...] = ()
    params_total_b: float | None = None
    params_active_b: float | None = None
    source: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_layers(self) -> int:
        return sum(g.count for g in self.layers)

    @property
    def num_full_attention_layers(self) -> int:
        return sum(g.count for g in self.layers if g.is_full_attention)


_SPEC_KEYS = {
    "name", "layers", "dtype", "state_dtype", "aliases", "params_total_b",
    "params_active_b", "source", "notes", "extra",
}


def _check_dtype(field_name: str, value: object) -> None:
    if value not in DTYPE_BYTES:
        raise ConfigError(field_name, value, f"unknown dtype; known: {', '.join(DTYPE_BYTES)}")


def _positive_int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(where, value, "must be an integer")
    if value <= 0:
        raise ConfigError(where, value, "must be positive")
    return value


def parse_layer_group(raw: object, where: str) -> LayerGroup:
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "a layer group must be a mapping")
    kind = raw.get("kind")
    if kind not in _REQUIRED:
        raise ConfigError(f"{where}.kind", kind, "unknown layer kind; known: gqa, mla, swa, linear")
    allowed = {"kind", *_REQUIRED[kind], *_OPTIONAL[kind]}
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", raw[key], f"not a field of a {kind} layer group")
    values: dict[str, Any] = {}
    for key in _REQUIRED[kind]:
        if key not in raw:
            raise ConfigError(f"{where}.{key}", None, f"missing (required for {kind})")
        values[key] = _positive_int(f"{where}.{key}", raw[key])
    for key in _OPTIONAL[kind]:
        if key in raw and raw[key] is not None:
            if key == "variant":
                values[key] = str(raw[key])
            else:
                values[key] = _positive_int(f"{where}.{key}", raw[key])
    if ("conv_channels" in values) != ("conv_kernel" in values):
        raise ConfigError(where, raw, "conv_channels and conv_kernel go together")
    return LayerGroup(kind=kind, **values)


def parse_spec(raw: object, where: str = "model") -> ModelSpec:
    """Validate a mapping (from YAML/JSON) into a ModelSpec."""
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "a model spec must be a mapping")
    for key in raw:
        if key not in _SPEC_KEYS:
            raise ConfigError(f"{where}.{key}", raw[key], "not a model-spec field")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name", name, "missing or empty")
    layers_raw = raw.get("layers")
    if not isinstance(layers_raw, list) or not layers_raw:
        raise ConfigError(f"{where}.layers", layers_raw, "must be a non-empty list of layer groups")
    layers = tuple(parse_layer_group(g, f"{where}.layers[{i}]") for i, g in enumerate(layers_raw))
    dtype = raw.get("dtype", "bf16")
    state_dtype = raw.get("state_dtype", "fp32")
    _check_dtype(f"{where}.dtype", dtype)
    _check_dtype(f"{where}.state_dtype", state_dtype)
    params: dict[str, float | None] = {}
    for key in ("params_total_b", "params_active_b"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or value <= 0):
            raise ConfigError(f"{where}.{key}", value, "must be a positive number or null")
        params[key] = None if value is None else float(value)
    return ModelSpec(
        name=name, layers=layers, dtype=dtype, state_dtype=state_dtype,
        aliases=tuple(raw.get("aliases") or ()), source=str(raw.get("source", "")),
        notes=str(raw.get("notes", "")), extra=dict(raw.get("extra") or {}), **params,
    )


def load_spec_file(path: str | Path) -> ModelSpec:
    """Load a model spec from a YAML or JSON file."""
    return parse_spec(read_structured(path, "model_file"), where=Path(path).name)


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """The spec back in models.json form (only the fields each kind uses)."""
    layers = []
    for g in spec.layers:
        entry: dict[str, Any] = {"kind": g.kind}
        for key in (*_REQUIRED[g.kind], *_OPTIONAL[g.kind]):
            value = getattr(g, key)
            if value:
                entry[key] = value
        layers.append(entry)
    return {"name": spec.name, "dtype": spec.dtype, "state_dtype": spec.state_dtype,
            "layers": layers}
