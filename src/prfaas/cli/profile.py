"""`prfaas profile`: measure this engine's T_prefill(l), S_kv(l) and decode step time here and
write the profile YAML the planner and simulator read. Default lengths 256..4K (well under a
minute on one thread); `--full` adds 8K and 16K."""

from __future__ import annotations

from pathlib import Path

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
@click.option("--out", default="engine_profile.yaml", show_default=True, type=click.Path())
@click.option("--full", is_flag=True, help="Also measure 8K and 16K prompts.")
@click.option("--lengths", default=None, help="Comma-separated prompt lengths (tokens).")
@click.option("--batches", default=None, help="Comma-separated decode batch sizes.")
@click.option("--reps", default=1, show_default=True, type=int)
@click.option("--context", "context_tokens", default=512, show_default=True, type=int,
              help="Context length of the decode-step measurement.")
@click.option("--preset", default="tiny", show_default=True, type=click.Choice(list(PRESETS)))
@click.option("--threads", default=None, type=int, help="torch threads (default 1).")
@click.option("--spec-out", default=None, type=click.Path(),
              help="Also write the engine's model spec (for `prfaas kv --model-file`).")
def command(out: str, full: bool, lengths: str | None, batches: str | None, reps: int,
            context_tokens: int, preset: str, threads: int | None, spec_out: str | None) -> None:
    """Measure the engine's prefill / KV / decode profile on this machine."""
    if reps <= 0:
        raise ConfigError("reps", reps, "must be positive")
    engine = Engine(engine_config(preset, threads=threads))
    if spec_out is not None:
        Path(spec_out).write_text(yaml.safe_dump(spec_to_dict(engine.config.to_spec()),
                                                 sort_keys=False))
    chosen = _ints(lengths, "lengths") or (FULL_LENGTHS if full else DEFAULT_LENGTHS)
    if max(chosen) > engine.config.max_context_tokens:
        raise ConfigError("lengths", max(chosen), "exceeds max_context_tokens")
    prof = run_profile(engine, chosen, _ints(batches, "batches") or DEFAULT_BATCHES, reps,
                       context_tokens)
    doc = profile_document(engine, prof)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    for p in doc["prefill"]["points"]:
        click.echo(f"prefill {p['length_tokens']:>6} tokens: {p['time_s']:.3f} s")
    for p in doc["decode"]["step_points"]:
        click.echo(f"decode batch {p['batch']:>3}: {p['step_s'] * 1e3:.1f} ms/step")
    click.echo(f"wrote {out}")
