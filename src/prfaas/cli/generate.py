"""`prfaas generate`: run the small hybrid model in one process.

This is the reference output every distributed run is compared with: same config, same
weights (seeded or loaded), same greedy tokens. `--json` prints {"text", "token_ids", ...}.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import click

from prfaas.core.errors import ConfigError
from prfaas.engine.engine import Engine
from prfaas.engine.presets import PRESETS, engine_config
from prfaas.engine.sampling import SamplingParams


@dataclass(frozen=True)
class Options:
    prompt: str
    max_tokens: int
    as_json: bool
    temperature: float
    top_p: float
    seed: int
    preset: str
    model_seed: int | None
    weights: str | None
    threads: int | None
    model_dir: str | None
    topology_path: str | None
    device: str | None = None


def _native(o: Options) -> None:
    # a weight seed asks for a random init: there is no trained model per seed
    weights = o.weights or ("seed" if o.model_seed is not None else None)
    config = engine_config(o.preset, seed=o.model_seed, threads=o.threads, weights=weights,
                           device=o.device)
    engine = Engine(config, digest_weights=False)
    prompt_ids = engine.tokenizer.encode(o.prompt)
    sampling = SamplingParams(temperature=o.temperature, top_p=o.top_p, seed=o.seed)
    t0 = time.perf_counter()
    token_ids = engine.generate(prompt_ids, o.max_tokens, sampling)
    elapsed_s = time.perf_counter() - t0
    text = engine.tokenizer.decode(token_ids)
    if not o.as_json:
        click.echo(text)
        return
    click.echo(json.dumps({
        "text": text, "token_ids": token_ids, "prompt_tokens": len(prompt_ids),
        "model": config.name, "layer_pattern": config.layer_pattern, "weights": config.weights,
        "seed": config.seed, "threads": config.threads, "device": config.device,
        "dtype": config.compute_dtype, "elapsed_s": round(elapsed_s, 4),
    }))


def _vllm(o: Options) -> None:
    from prfaas.integrations.vllm.cli import generate_vllm

    generate_vllm(o.prompt, o.max_tokens, o.as_json, o.model_dir, o.topology_path)


# the single-process reference of each engine that has one (the emulated engine's is its
# `generate`, used by its tests)
REFERENCES: dict[str, Callable[[Options], None]] = {"native": _native, "vllm": _vllm}


@click.command("generate")
@click.option("--prompt", required=True, help="Prompt text (byte-level tokens, BOS first).")
@click.option("--max-tokens", default=32, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int, help="Sampling seed.")
@click.option("--preset", default="tiny", show_default=True, type=click.Choice(list(PRESETS)))
@click.option("--model-seed", default=None, type=int,
              help="Random weights from this seed instead of the preset's trained ones.")
@click.option("--weights", default=None,
              help="`trained` (the tiny and mimo-like presets' default), `seed`, or a "
                   "safetensors weights file.")
@click.option("--threads", default=None, type=int, help="torch threads (default 1).")
@click.option("--device", default=None,
              help="native: cpu (default), cuda or cuda:N (bf16 on a GPU; docs/gpu.md).")
@click.option("--engine", "engine_kind", default="native", show_default=True,
              type=click.Choice(sorted(REFERENCES)),
              help="vllm: one standalone vLLM engine, greedy (the `vllm` extra).")
@click.option("--model", "model_dir", default=None, help="vllm: model directory.")
@click.option("--topology", "topology_path", default=None,
              help="vllm: take the model and engine arguments from this topology "
                   "(default topologies/vllm-local-llama.yaml).")
def command(prompt: str, max_tokens: int, as_json: bool, temperature: float, top_p: float,
            seed: int, preset: str, model_seed: int | None, weights: str | None,
            threads: int | None, device: str | None, engine_kind: str, model_dir: str | None,
            topology_path: str | None) -> None:
    """Generate text with the hybrid-attention engine (the single-process reference)."""
    if device is not None and engine_kind != "native":
        raise ConfigError("device", device, "--device is the native engine's; a vLLM engine "
                                            "runs where its build does (docs/gpu.md)")
    REFERENCES[engine_kind](Options(prompt, max_tokens, as_json, temperature, top_p, seed, preset,
                                    model_seed, weights, threads, model_dir, topology_path,
                                    device))
