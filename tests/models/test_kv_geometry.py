"""KV geometry: every catalog model against an independent reading of models.json, and one
hand-computed custom spec per layer kind."""

import json
from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.catalog import catalog, find_model
from prfaas.models.kv import geometry
from prfaas.models.spec import parse_spec

SHARED = Path(__file__).resolve().parents[2] / "src/prfaas/data/models.json"
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def _expected(raw: dict, length: int, dtype: str | None = None) -> float:
    """Straight from the field definitions in data/README.md, written independently."""
    kv_b = BYTES[dtype or raw["dtype"]]
    st_b = BYTES[raw["state_dtype"]]
    total = 0.0
    for g in raw["layers"]:
        n = g["count"]
        if g["kind"] == "gqa":
            total += n * length * g["kv_heads"] * (g["k_head_dim"] + g["v_head_dim"]) * kv_b
        elif g["kind"] == "mla":
            total += n * length * (g["kv_lora_rank"] + g["rope_head_dim"]) * kv_b
        elif g["kind"] == "swa":
            held = min(length, g["window"])
            total += n * held * g["kv_heads"] * (g["k_head_dim"] + g["v_head_dim"]) * kv_b
        else:
            conv = g.get("conv_channels", 0) * (g.get("conv_kernel", 1) - 1)
            # recurrent state in state_dtype, short-conv state in the KV dtype (as vLLM)
            total += n * (g["heads"] * g["k_head_dim"] * g["v_head_dim"] * st_b + conv * kv_b)
    return total


@pytest.mark.parametrize("raw", json.loads(SHARED.read_text()), ids=lambda r: r["name"])
@pytest.mark.parametrize("dtype", [None, "fp8", "fp32"])
def test_catalog_model_sizes_match_models_json(raw: dict, dtype: str | None) -> None:
    geo = geometry(find_model(raw["name"]), dtype)
    for length in (1, 100, 1024, 8192, 32768, 131072):
        assert geo.size_bytes(length) == pytest.approx(_expected(raw, length, dtype), rel=1e-12)


def test_kimi_linear_fixed_state_keeps_conv_in_kv_dtype() -> None:
    # 20 KDA layers: 32 heads x 128 x 128 fp32 recurrent state (2 MiB each) plus a bf16
    # conv state of 3 x 4096 channels x 3 taps = 43,417,600 B = 41.41 MiB (was 42.81 MiB
    # when the conv state was counted in fp32)
    geo = geometry(find_model("Kimi-Linear-48B-A3B"))
    assert geo.linear_state_bytes == 43_417_600
    assert f"{geo.linear_state_bytes / 2**20:.2f}" == "41.41"


def test_catalog_has_every_model_and_alias() -> None:
    raw = json.loads(SHARED.read_text())
    assert len(catalog()) == len(raw)
    assert find_model("kimi linear").name == "Kimi-Linear-48B-A3B"
    assert find_model("Qwen3-235B").name == "Qwen3-235B-A22B"


def test_custom_gqa_by_hand() -> None:
    spec = parse_spec({"name": "g", "dtype": "bf16", "layers": [
        {"kind": "gqa", "count": 2, "kv_heads": 4, "k_head_dim": 64, "v_head_dim": 32}]})
    geo = geometry(spec)
    assert geo.kv_bytes_per_token == 2 * 4 * (64 + 32) * 2  # 1536
    assert geo.state_bytes == 0
    assert geo.size_bytes(10) == 15360


def test_custom_mla_by_hand() -> None:
    spec = parse_spec({"name": "m", "dtype": "fp8", "layers": [
        {"kind": "mla", "count": 3, "kv_lora_rank": 512, "rope_head_dim": 64}]})
    assert geometry(spec).size_bytes(1000) == 3 * 576 * 1 * 1000


def test_custom_swa_by_hand_saturates_at_window() -> None:
    spec = parse_spec({"name": "s", "dtype": "fp16", "layers": [
        {"kind": "swa", "count": 1, "window": 128, "kv_heads": 2, "k_head_dim": 16,
         "v_head_dim": 16}]})
    geo = geometry(spec)
    per_tok = 2 * 32 * 2
    assert geo.size_bytes(100) == 100 * per_tok
    assert geo.size_bytes(5000) == 128 * per_tok
    assert geo.state_bytes == 128 * per_tok and geo.kv_bytes_per_token == 0


def test_custom_linear_by_hand_is_constant() -> None:
    spec = parse_spec({"name": "l", "dtype": "bf16", "state_dtype": "fp32", "layers": [
        {"kind": "linear", "count": 4, "heads": 2, "k_head_dim": 8, "v_head_dim": 16,
         "conv_channels": 10, "conv_kernel": 4}]})
    geo = geometry(spec)
    expected = 4 * (2 * 8 * 16 * 4 + 10 * 3 * 2)  # recurrent fp32, conv bf16
    assert geo.state_bytes == expected
    assert geo.size_bytes(1) == geo.size_bytes(100000) == expected


@pytest.mark.parametrize(("raw", "field"), [
    ({"name": "x", "layers": [{"kind": "gqa", "count": 2, "kv_heads": 4, "k_head_dim": 8}]},
     "v_head_dim"),
    ({"name": "x", "layers": [{"kind": "gqa", "count": -1, "kv_heads": 4, "k_head_dim": 8,
                               "v_head_dim": 8}]}, "count"),
    ({"name": "x", "layers": [{"kind": "mamba", "count": 1}]}, "kind"),
    ({"name": "x", "layers": [{"kind": "mla", "count": 1, "kv_lora_rank": 8,
                               "rope_head_dim": 8, "bogus": 1}]}, "bogus"),
    ({"name": "x", "dtype": "int3", "layers": [{"kind": "mla", "count": 1, "kv_lora_rank": 8,
                                                 "rope_head_dim": 8}]}, "dtype"),
    ({"name": "x", "layers": []}, "layers"),
])
def test_malformed_specs_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(raw)
    assert field in str(info.value)
