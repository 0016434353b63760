"""S_kv(l) on the wire: fp8 / bf16 full-attention KV with the fp8 scales counted, linear and SWA
state untouched; the scenario's `link.wire_dtype` reaches the planner and the simulator."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.catalog import find_model
from prfaas.models.kv import geometry
from prfaas.models.profile import KVSize
from prfaas.planner.search import inputs_from_scenario
from prfaas.scenario import load_scenario, parse_scenario
from prfaas.sim.system import build_system
from prfaas.transport.quant import encode_arrays


def test_kimi_linear_fp8_is_half_plus_scales() -> None:
    geo = geometry(find_model("Kimi-Linear-48B-A3B"))
    wire = geo.on_wire("fp8")
    # 7 MLA layers x (512 + 64) fp8 bytes, plus 2 fp32 scales per layer per 16 tokens
    assert wire.kv_bytes_per_token == 7 * 576 + 7 * 2 * 4 / 16
    assert wire.linear_state_bytes == geo.linear_state_bytes
    assert geo.on_wire("bf16") is geo  # a bf16 cache: bf16 on the wire changes nothing
    assert geo.on_wire(None) is geo


def test_swa_and_linear_keep_their_dtype() -> None:
    geo = geometry(find_model("MiMo-V2-Flash"))
    wire = geo.on_wire("fp8_e4m3")
    assert wire.swa_groups == geo.swa_groups and wire.state_bytes == geo.state_bytes
    assert wire.kv_bytes_per_token < 0.51 * geo.kv_bytes_per_token


def test_wire_geometry_counts_what_the_encoder_emits() -> None:
    """The model's wire bytes per token against the bytes quant.encode_arrays really produces
    for one 16-token block of a gqa layer (2 tensors [16, heads, dim])."""
    heads, dim, tokens = 4, 32, 16
    arrays = [(n, np.ones((tokens, heads, dim), np.float32)) for n in ("k", "v")]
    wire_bytes = sum(a.nbytes for _, a in encode_arrays(arrays, "fp8"))
    from prfaas.models.spec import LayerGroup, ModelSpec

    spec = ModelSpec("t", (LayerGroup("gqa", 1, kv_heads=heads, k_head_dim=dim,
                                      v_head_dim=dim),), dtype="fp32")
    assert geometry(spec).on_wire("fp8").kv_bytes_per_token * tokens == wire_bytes


def test_bad_wire_dtype_names_the_value() -> None:
    with pytest.raises(ConfigError, match="fp4"):
        geometry(find_model("Kimi-Linear-48B-A3B")).on_wire("fp4")


def test_fitted_kv_on_the_wire() -> None:
    kv = KVSize(100.0, 1000.0)
    wire = kv.on_wire("fp8", "bf16")
    assert wire.fixed_bytes == 100.0 and 500.0 < wire.per_token_bytes <= 1000 * 0.51
    assert kv.on_wire("bf16", "bf16") is kv


def test_scenario_wire_dtype_reaches_planner_and_simulator() -> None:
    s = load_scenario("public-internet")
    raw = copy.deepcopy(s.raw)
    raw["link"]["wire_dtype"] = "fp8"
    fp8 = parse_scenario(raw, s.path)
    assert fp8.wire_dtype == "fp8_e4m3" and s.wire_kv is s.kv
    assert inputs_from_scenario(fp8).kv.per_token_bytes < 0.51 * s.kv.per_token_bytes
    cfg = build_system(fp8, "prfaas_pd", plan_mode="paper")
    assert cfg.kv.per_token_bytes == fp8.wire_kv.per_token_bytes
    assert cfg.cache_kv is fp8.kv  # a prefix cache holds the cache dtype
    raw["link"]["wire_dtype"] = "int3"
    with pytest.raises(ConfigError, match="int3"):
        parse_scenario(raw, s.path)


def test_cli_kv_wire_dtype_must_show() -> None:
    out = subprocess.run([sys.executable, "-m", "prfaas", "kv", "--model", "Kimi-Linear-48B-A3B",
                          "--lengths", "32K", "--wire-dtype", "fp8", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["wire_dtype"] == "fp8_e4m3"
    assert data["kv_bytes_per_token"] <= 0.55 * data["cache_kv_bytes_per_token"]
    assert data["cache_kv_bytes_per_token"] == 7 * 576 * 2
