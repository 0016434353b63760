"""What sim-vs-live and profiling need to know of a topology's engine, asked through the engine
registry (serve/engines.py), never by testing the engine's name: its registry name, the served
model's context, tokenizer vocabulary, depth (the simulator's layer-wise transfer tail) and
cache block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prfaas.models.spec import ModelSpec


@dataclass(frozen=True)
class ModelFacts:
    engine: str
    max_context_tokens: int
    vocab_size: int
    num_layers: int
    block_size_tokens: int = 1  # the served model's cache block (the router's hash block)


def _native_spec(topology: Any) -> ModelSpec:
    from prfaas.serve.native import engine_config

    return engine_config(topology.model).to_spec()


def _vllm_spec(topology: Any) -> ModelSpec:
    from prfaas.integrations.vllm.deploy import settings
    from prfaas.integrations.vllm.served_model import ServedModel

    return ServedModel.from_settings(settings(topology)).to_spec()


# engine name -> the served model's layer spec (one entry per engine sim-vs-live supports)
SPECS = {"native": _native_spec, "vllm": _vllm_spec}


def engine_name(topology: Any) -> str:
    from prfaas.serve.engines import engine_backend

    return engine_backend(topology).name


def model_facts(topology: Any) -> ModelFacts:
    from prfaas.core.errors import UnknownNameError
    from prfaas.serve.engines import engine_backend

    backend = engine_backend(topology)
    if backend.name not in SPECS:
        raise UnknownNameError("engine", backend.name, list(SPECS))
    backend.prepare()  # e.g. vLLM: build the tiny model if missing (the tokenizer reads it)
    card = backend.card()
    return ModelFacts(backend.name, card.max_context_tokens,
                      int(backend.tokenizer().vocab_size), SPECS[backend.name](topology).num_layers,
                      card.block_size_tokens)


def _native_profile(topology: Any, log_dir: str) -> dict[str, Any]:
    from prfaas.engine.engine import Engine
    from prfaas.engine.profiler import profile_document, run_profile
    from prfaas.serve.native import engine_config

    engine = Engine(engine_config(topology.model))
    return profile_document(engine, run_profile(engine, reps=3))


def _vllm_profile(topology: Any, log_dir: str) -> dict[str, Any]:
    from prfaas.integrations.vllm.profile import profile_topology

    return profile_topology(topology, log_dir=log_dir)


# engine name -> measure its profile here (the planner's YAML document)
PROFILERS = {"native": _native_profile, "vllm": _vllm_profile}


def measure_profile(topology: Any, log_dir: str, idle_routes: bool = True) -> dict[str, Any]:
    """The engine's profile, then (`idle_routes`) each route's idle TTFT through the started
    topology (experiments/idle_routes.py) at the profile's prefill lengths."""
    from prfaas.core.errors import UnknownNameError
    from prfaas.experiments import idle_routes as idle

    name = engine_name(topology)
    if name not in PROFILERS:
        raise UnknownNameError("engine", name, list(PROFILERS))
    doc = PROFILERS[name](topology, log_dir)
    if idle_routes:
        lengths = [int(p["length_tokens"]) for p in doc["prefill"]["points"]]
        doc["idle_ttft"] = idle.measure(topology, lengths, log_dir)
    return doc
