"""Engine API behaviour: tokenizer, config validation, hooks, prefix checks, sampling, weights,
generate/EOS, and the `prfaas generate` / `prfaas profile` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner
from engine_factories import engine, prompt

from prfaas.core.errors import ConfigError
from prfaas.engine import (
    ByteTokenizer,
    Engine,
    EngineConfig,
    LayerKV,
    SamplingParams,
    sample,
)
from prfaas.models.kv import geometry
from prfaas.models.spec import load_spec_file


def test_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo, wörld ✓")
    assert ids[0] == tok.bos_id and max(ids[1:]) < 256
    assert tok.decode([*ids, tok.eos_id]) == "héllo, wörld ✓"


@pytest.mark.parametrize(("overrides", "field"), [
    ({"layer_pattern": "KXM"}, "layer_pattern"), ({"hidden": 0}, "hidden"),
    ({"num_kv_heads": 3}, "num_kv_heads"), ({"max_context_tokens": 1000}, "max_context_tokens"),
    ({"vocab_size": 100}, "vocab_size"),
])
def test_config_rejects_bad_values(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        EngineConfig(**overrides)


def test_on_layer_hook_order_ranges_and_kinds() -> None:
    eng = engine("mixed")
    ids = prompt(180)
    got: list[LayerKV] = []
    eng.prefill(ids, prefix=eng.prefill(ids[:100]).kv.snapshot_at(64), on_layer=got.append)
    assert [g.layer_index for g in got] == [0, 1, 2, 3]
    assert [g.kind for g in got] == ["linear", "gqa", "swa", "mla"]
    assert [(g.start_token, g.end_token) for g in got] == [(64, 180), (64, 180), (100, 180),
                                                          (64, 180)]


def test_prefix_must_be_aligned_and_match() -> None:
    eng = engine("kimi")
    ids = prompt(200)
    kv = eng.prefill(ids).kv
    with pytest.raises(ConfigError, match="block size"):
        eng.prefill(ids, prefix=kv.snapshot_at(200))
    with pytest.raises(ConfigError, match="another prompt"):
        eng.prefill(prompt(200, seed=8), prefix=kv.snapshot_at(128))
    with pytest.raises(ConfigError, match="shorter"):
        eng.prefill(ids[:128], prefix=kv.snapshot_at(128))
    with pytest.raises(ConfigError, match="max_context"):
        Engine(EngineConfig.tiny(max_context_tokens=128)).prefill(prompt(129))


def test_sampling_is_seeded_and_top_p_narrows() -> None:
    logits = torch.randn(258, generator=torch.Generator().manual_seed(0))
    hot = SamplingParams(temperature=1.5, seed=3)
    draws = [sample(logits, hot, step) for step in range(40)]
    assert draws == [sample(logits, hot, step) for step in range(40)]
    assert len(set(draws)) > 5
    other = [sample(logits, SamplingParams(temperature=1.5, seed=4), s) for s in range(40)]
    assert other != draws
    narrow = SamplingParams(temperature=1.5, top_p=1e-6, seed=3)
    assert {sample(logits, narrow, s) for s in range(20)} == {int(logits.argmax())}
    with pytest.raises(ConfigError):
        SamplingParams(top_p=0.0)


def test_generate_with_sampling_is_reproducible_and_differs_from_greedy() -> None:
    eng = engine("kimi")
    ids = prompt(40)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    a, b = eng.generate(ids, 10, params), eng.generate(ids, 10, params)
    assert a == b and len(a) == 10
    assert a != eng.generate(ids, 10, SamplingParams(ignore_eos=True))


def test_generate_stops_at_eos() -> None:
    eng = Engine(EngineConfig.tiny(layer_pattern="KM", weights="seed"))
    ids = prompt(30)
    free = eng.generate(ids, 8, SamplingParams(ignore_eos=True))
    # the latest token that first appears at its own position: generation must stop there
    stop_at = max(i for i, t in enumerate(free) if t not in free[:i])
    eng.tokenizer.eos_id = free[stop_at]  # pretend that token is EOS
    assert eng.generate(ids, 8) == free[:stop_at]
    assert eng.generate(ids, 8, SamplingParams(ignore_eos=True)) == free


def test_safetensors_round_trip(tmp_path: Path) -> None:
    cfg = EngineConfig.tiny(layer_pattern="KM", seed=5, weights="seed")
    path = tmp_path / "w.safetensors"
    Engine(cfg).model.save_safetensors(path)
    other = Engine(EngineConfig.tiny(layer_pattern="KM", seed=6, weights="seed"),
                   weights_path=str(path))
    ids = prompt(50)
    assert torch.equal(other.prefill(ids).logits, Engine(cfg).prefill(ids).logits)
    # the same file named in the config (weights: PATH) loads the same model
    named = Engine(EngineConfig.tiny(layer_pattern="KM", weights=str(path)))
    assert torch.equal(named.prefill(ids).logits, Engine(cfg).prefill(ids).logits)
    with pytest.raises(ConfigError, match="names differ"):
        Engine(EngineConfig.tiny(layer_pattern="KMK", weights="seed"), weights_path=str(path))


def test_trained_weights_fit_their_preset_only_and_differ_from_the_seeded_init() -> None:
    """The presets load the shipped weights (engine/weights.py); another shape is told to use
    weights: seed; the trained model is not its random init (the control)."""
    trained, seeded = engine("kimi"), Engine(EngineConfig.tiny(weights="seed"))
    assert trained.config.weights == "trained"
    ids = prompt(40)
    assert not torch.equal(trained.prefill(ids).logits, seeded.prefill(ids).logits)
    with pytest.raises(ConfigError, match="weights: seed"):
        Engine(EngineConfig.tiny(layer_pattern="KM"))
    with pytest.raises(ConfigError, match="no trained weights"):
        Engine(EngineConfig.small(weights="trained"))


def test_generate_cli_json_matches_engine() -> None:
    from prfaas.cli.generate import command

    result = CliRunner().invoke(command, ["--prompt", "Hi there", "--max-tokens", "6", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    eng = engine("kimi")
    expected = eng.generate(eng.tokenizer.encode("Hi there"), 6)
    assert out["token_ids"] == expected
    assert out["text"] == eng.tokenizer.decode(expected)


def test_profile_cli_writes_planner_format(tmp_path: Path) -> None:
    from prfaas.cli.profile import command

    out = tmp_path / "p.yaml"
    spec = tmp_path / "spec.yaml"
    result = CliRunner().invoke(command, ["--out", str(out), "--lengths", "64,256",
                                          "--batches", "1,4", "--context", "64",
                                          "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["model"] == "prfaas-tiny-kda" and doc["gpus_per_instance"] == 1
    lengths = [p["length_tokens"] for p in doc["prefill"]["points"]]
    assert lengths == [64, 256] and all(p["time_s"] > 0 for p in doc["prefill"]["points"])
    kv = [p["bytes"] for p in doc["kv"]["points"]]
    cfg = EngineConfig.tiny()  # the preset `prfaas profile` measures by default
    mla_layers = cfg.layer_pattern.count("M")
    assert mla_layers > 0  # otherwise the KV would not grow with the prompt
    # 192 more tokens, each caching the latent + rope key in every MLA layer, fp32
    assert kv[1] - kv[0] == 192 * mla_layers * (cfg.kv_lora_rank + cfg.rope_head_dim) * 4
    assert [p["batch"] for p in doc["decode"]["step_points"]] == [1, 4]
    assert doc["decode"]["bs_max"] == 4
    sized = geometry(load_spec_file(spec))  # what `prfaas kv --model-file` computes
    assert [sized.size_bytes(n) for n in (64, 256)] == kv
