"""Measure this engine on this machine: T_prefill(l), S_kv(l) and the decode step time by batch.

The result is the profile file the planner and simulator read (see `profile_document`).
Prompts are pseudo-random bytes from a seeded generator; prefill times are medians of `reps`
rounds (each round times every length once) after one warm-up; decode steps run on sequences
that share one prefilled prefix (shared paged blocks), each appending its own tail, at
`context_tokens` of context.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from prfaas.engine.engine import DecodeSeq, Engine
from prfaas.models.profile import MeasuredProfile

DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096)
FULL_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_BATCHES = (1, 8, 32)


EngineProfile = MeasuredProfile  # the native engine's measurement


def prompt_tokens(length: int, seed: int = 0) -> list[int]:
    """`length` pseudo-random byte tokens (a BOS first), the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return [256, *torch.randint(0, 256, (length - 1,), generator=gen).tolist()]


def median_time_s(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_prefill(engine: Engine, lengths: tuple[int, ...], reps: int,
                    clock: Callable[[], float] = time.perf_counter,
                    ) -> tuple[list[tuple[int, float]], list[tuple[int, int]]]:
    """Each length's median prefill time over `reps` rounds, every round timing every length
    once (lengths interleaved): on a shared host a slow spell then falls on one round of every
    length, which the median drops, not on every rep of the lengths timed during it (timed
    length after length, the longest lengths, the PrfaaS route's, came out slow together)."""
    engine.prefill(prompt_tokens(min(lengths)))  # warm-up (allocator, kernels)
    prompts = {n: prompt_tokens(n, seed=n) for n in lengths}
    times: dict[int, list[float]] = {n: [] for n in lengths}
    sizes: dict[int, int] = {}
    for _ in range(reps):
        for n in lengths:
            t0 = clock()
            result = engine.prefill(prompts[n])
            times[n].append(clock() - t0)
            sizes[n] = result.kv.byte_size()
    return ([(n, statistics.median(times[n])) for n in lengths],
            [(n, sizes[n]) for n in lengths])


def measure_decode(engine: Engine, batches: tuple[int, ...], context_tokens: int,
                   steps: int) -> list[tuple[int, float]]:
    base = engine.prefill(prompt_tokens(context_tokens, seed=1))
    points = []
    for batch in batches:
        seqs = [DecodeSeq(base.kv.snapshot_at(context_tokens), base.first_token)
                for _ in range(batch)]
        engine.decode_step(seqs)  # warm-up

        def step(seqs: list[DecodeSeq] = seqs) -> None:
            engine.decode_step(seqs)

        points.append((batch, median_time_s(step, steps)))
    return points


def run_profile(engine: Engine, lengths: tuple[int, ...] = DEFAULT_LENGTHS,
                batches: tuple[int, ...] = DEFAULT_BATCHES, reps: int = 1,
                context_tokens: int = 512, decode_steps: int = 8) -> EngineProfile:
    prefill, kv = measure_prefill(engine, lengths, reps)
    decode = measure_decode(engine, batches, context_tokens, decode_steps)
    return EngineProfile(tuple(prefill), tuple(kv), tuple(decode), reps, context_tokens)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_model(engine: Engine) -> str:
    """What computed: the GPU's name (and the host CPU) or the CPU's, with its threads."""
    if engine.device.type == "cuda":
        return (f"{torch.cuda.get_device_name(engine.device)} ({engine.config.device}), "
                f"host {cpu_model()}")
    return f"{cpu_model()}, {engine.config.threads} threads"


def profile_document(engine: Engine, prof: EngineProfile) -> dict[str, Any]:
    """The profile in the planner's YAML format. Its name says the device kind
    (`cpu-prfaas-tiny-kda`, `cuda-prfaas-kimi-linear-48b-a3b-like`). Each timed prefill and
    decode step ends in a host read of its result, so GPU times include every kernel."""
    cfg = engine.config
    how = (f"prfaas profile: engine prefill from scratch (median of {prof.reps} rounds over the"
           f" lengths, after a warm-up),"
           f" S_kv = SequenceKV.byte_size (fp32, as shipped), decode step = median of steps at"
           f" {prof.context_tokens} tokens of context; torch {torch.__version__};"
           f" {dt.datetime.now(dt.UTC).date().isoformat()}; config: pattern={cfg.layer_pattern}"
           f" hidden={cfg.hidden} heads={cfg.num_heads} block={cfg.block_size_tokens}"
           f" seed={cfg.seed} threads={cfg.threads} device={cfg.device}"
           f" dtype={cfg.compute_dtype} prefill_chunk={cfg.chunk_tokens}")
    return prof.document(f"{engine.device.type}-{cfg.name}", device_model(engine),
                         cfg.to_spec().name, how)
