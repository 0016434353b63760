"""CLI glue: `prfaas vllm-model` and `prfaas generate --engine vllm`."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import click

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.model_builder import ARCHS, build_model
from prfaas.serve.topology import load_topology
from prfaas.serve.vllm_settings import VllmSettings

DEFAULT_TOPOLOGY = "topologies/vllm-local-llama.yaml"


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("--engine", "vllm", "vLLM is not installed: `make vllm` (the extra)")


def settings_for(model_dir: str | None, topology_path: str | None) -> VllmSettings:
    path = topology_path or DEFAULT_TOPOLOGY
    if topology_path is None and not Path(path).is_file():
        base = VllmSettings()
    else:
        topo = load_topology(path)
        if topo.vllm is None:
            raise ConfigError("--topology", path, "has no `vllm:` section")
        base = topo.vllm
    if model_dir is not None:
        if not (Path(model_dir) / "config.json").is_file():
            raise ConfigError("--model", model_dir, "no config.json there (prfaas vllm-model)")
        base = dataclasses.replace(base, model_dir=str(Path(model_dir).resolve()))
    return base


def generate_vllm(prompt: str, max_tokens: int, as_json: bool, model_dir: str | None,
                  topology_path: str | None) -> None:
    require_vllm()
    if max_tokens < 1:
        raise ConfigError("--max-tokens", max_tokens, "must be >= 1")
    from prfaas.integrations.vllm.model_builder import ensure_model
    from prfaas.integrations.vllm.reference import generate

    s = settings_for(model_dir, topology_path)
    if model_dir is None:
        ensure_model(s.arch, s.model_dir, s.model_seed, s.model_weights)
    out = generate(s, prompt, max_tokens)
    click.echo(json.dumps(out) if as_json else out["text"])


@click.command("vllm-model")
@click.option("--arch", required=True, type=click.Choice(list(ARCHS)))
@click.option("--out", "out_dir", required=True, help="Directory to write the model to.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Weight seed (with --weights seed).")
@click.option("--weights", default="trained", show_default=True,
              type=click.Choice(["trained", "seed"]),
              help="trained: the shipped weights (trained on the stdlib's docstrings); seed: "
                   "random from --seed.")
def command(arch: str, out_dir: str, seed: int, weights: str) -> None:
    """Build a tiny real-architecture HF model (shipped trained or seeded random weights)."""
    path = build_model(arch, out_dir, seed, weights)
    click.echo(f"wrote {arch} model to {path}")
