"""`prfaas profile`: measure an engine's T_prefill(l), S_kv(l) and decode step time here and
write the profile YAML the planner and simulator read.

`--engine native` (the default): this package's engine in-process; lengths 256..4K (well under
a minute on one thread), `--full` adds 8K and 16K. `--engine vllm --topology T`: the topology's
vLLM instances over their OpenAI API (integrations/vllm/profile.py): a running one at `--url`,
else a standalone instance with the topology's engine arguments started for the measurement;
then (unless --no-idle-routes) the topology itself, idle, for each route's TTFT one request at a
time (experiments/idle_routes.py): the simulator's per-route fixed overheads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from prfaas.core.errors import ConfigError
from prfaas.engine.engine import Engine
from prfaas.engine.presets import PRESETS, engine_config
from prfaas.engine.profiler import (
    DEFAULT_BATCHES,
    DEFAULT_LENGTHS,
    FULL_LENGTHS,
    profile_document,
    run_profile,
)
from prfaas.models.spec import spec_to_dict


def _ints(text: str | None, field: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(field, text, "expected comma-separated integers") from None
    if not values or min(values) <= 0:
        raise ConfigError(field, text, "expected positive integers")
    return values


@click.command("profile")
@click.option("--engine", "engine_name", default="native", show_default=True,
              type=click.Choice(["native", "vllm"]), help="Which engine to measure.")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="vllm: the topology whose model and engine arguments are measured.")
@click.option("--url", default=None, help="vllm: a running instance of the topology's model.")
@click.option("--idle-routes/--no-idle-routes", default=True, show_default=True,
              help="vllm without --url: also start the topology and time each route's TTFT "
                   "one request at a time (the profile's idle_ttft: the simulator's per-route "
                   "fixed overheads).")
@click.option("--scenario-out", default=None, type=click.Path(dir_okay=False),
              help="With --topology: also write the deployment as a scenario on this profile "
                   "(`prfaas plan --scenario` gives its t and N_p:N_d).")
@click.option("--out", default="engine_profile.yaml", show_default=True, type=click.Path())
@click.option("--full", is_flag=True, help="Also measure 8K and 16K prompts.")
@click.option("--lengths", default=None, help="Comma-separated prompt lengths (tokens).")
@click.option("--batches", default=None, help="Comma-separated decode batch sizes.")
@click.option("--reps", default=1, show_default=True, type=int)
@click.option("--context", "context_tokens", default=512, show_default=True, type=int,
              help="Context length of the decode-step measurement.")
@click.option("--preset", default="tiny", show_default=True, type=click.Choice(list(PRESETS)))
@click.option("--threads", default=None, type=int, help="torch threads (default 1).")
@click.option("--device", default=None,
              help="native: cpu (default), cuda or cuda:N (bf16 on a GPU; docs/gpu.md).")
@click.option("--spec-out", default=None, type=click.Path(),
              help="Also write the engine's model spec (for `prfaas kv --model-file`).")
def command(engine_name: str, topology_path: str | None, url: str | None, idle_routes: bool,
            scenario_out: str | None, out: str, full: bool,
            lengths: str | None, batches: str | None, reps: int, context_tokens: int,
            preset: str, threads: int | None, device: str | None, spec_out: str | None) -> None:
    """Measure an engine's prefill / KV / decode profile on this machine."""
    if reps <= 0:
        raise ConfigError("reps", reps, "must be positive")
    if device is not None and engine_name != "native":
        raise ConfigError("device", device, "--device is the native engine's; vLLM instances "
                                            "run where the topology puts them (docs/gpu.md)")
    if engine_name == "vllm":
        doc = _vllm(topology_path, url, _ints(lengths, "lengths"), _ints(batches, "batches"),
                    reps, context_tokens)
        if idle_routes and url is None and topology_path is not None:
            doc["idle_ttft"] = _idle(topology_path, doc)
        _write(doc, out)
        if scenario_out is not None:
            _scenario(topology_path, out, scenario_out)
        return
    engine = Engine(engine_config(preset, threads=threads, device=device), digest_weights=False)
    if spec_out is not None:
        Path(spec_out).write_text(yaml.safe_dump(spec_to_dict(engine.config.to_spec()),
                                                 sort_keys=False))
    chosen = _ints(lengths, "lengths") or (FULL_LENGTHS if full else DEFAULT_LENGTHS)
    if max(chosen) > engine.config.max_context_tokens:
        raise ConfigError("lengths", max(chosen), "exceeds max_context_tokens")
    prof = run_profile(engine, chosen, _ints(batches, "batches") or DEFAULT_BATCHES, reps,
                       context_tokens)
    _write(profile_document(engine, prof), out)
    if scenario_out is not None:
        _scenario(topology_path, out, scenario_out)


def _vllm(topology_path: str | None, url: str | None, lengths: tuple[int, ...] | None,
          batches: tuple[int, ...] | None, reps: int, context_tokens: int) -> dict[str, Any]:
    from prfaas.integrations.vllm.profile import profile_topology
    from prfaas.serve.topology import load_topology

    if topology_path is None:
        raise ConfigError("topology", None, "--engine vllm needs --topology")
    kwargs: dict[str, Any] = {"reps": reps, "context_tokens": min(context_tokens, 256)}
    if lengths:
        kwargs["lengths"] = lengths
    if batches:
        kwargs["batches"] = batches
    return profile_topology(load_topology(topology_path), url, **kwargs)


def _idle(topology_path: str, doc: dict[str, Any]) -> dict[str, Any]:
    import tempfile

    from prfaas.experiments.idle_routes import measure
    from prfaas.serve.topology import load_topology

    lengths = [int(p["length_tokens"]) for p in doc["prefill"]["points"]]
    return measure(load_topology(topology_path), lengths,
                   tempfile.mkdtemp(prefix="prfaas-profile-idle-"))


def _scenario(topology_path: str | None, profile: str, path: str) -> None:
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.sim_vs_live.options import QUICK
    from prfaas.experiments.sim_vs_live.scenario import scenario_dict
    from prfaas.serve.topology import load_topology

    if topology_path is None:
        raise ConfigError("scenario_out", path, "needs --topology")
    topology = load_topology(topology_path)
    raw = scenario_dict(topology, Path(profile).resolve(), QUICK,
                        model_facts(topology).max_context_tokens)
    Path(path).write_text(yaml.safe_dump(raw, sort_keys=False))
    click.echo(f"wrote {path} (prfaas plan --scenario {path})")


def _write(doc: dict[str, Any], out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    for p in doc["prefill"]["points"]:
        click.echo(f"prefill {p['length_tokens']:>6} tokens: {p['time_s']:.3f} s")
    for p in doc["decode"]["step_points"]:
        click.echo(f"decode batch {p['batch']:>3}: {p['step_s'] * 1e3:.1f} ms/step")
    click.echo(f"wrote {out}")
