"""`prfaas profile --engine vllm`: a vLLM instance's T_prefill(l), S_kv(l) and decode step time vs
batch, in the profile format scenarios read (models/profile_file.py). Nothing here imports vLLM:
the instance is measured over its OpenAI API, as the deployment's router sees it.

- T_prefill(l): the client's wall time of a `max_tokens: 1` completion of a fresh random
  token-id prompt of l tokens (no prefix-cache hit), median of `reps` rounds over the lengths
  after a warm-up: the prefill plus one sampled token and one HTTP round trip on loopback.
- S_kv(l): what PrfaasConnector puts on the link for an l-token prompt, from the served model's
  KV layout (served_model.py): whole `block_size_tokens` blocks of every attention layer for
  the l - backoff tokens the producer computes (backoff 1 on a model with recurrent layers:
  the decoder recomputes the last token), the recurrent (conv + SSM) state of every linear
  layer once, and the 24-byte meta tensor. `sim-vs-live` compares it with the bytes the
  connector counted per request.
- decode step(b): b concurrent requests (prompts of `context_tokens`, ignore_eos) generating
  `steps` tokens, and b generating 1: (median wall time of the first - of the second) /
  (steps - 1); the median over max(reps, 3) such pairs. Client wall times of whole
  (non-streamed) answers: streamed chunk times were tried first and came out compressed
  (0.2 ms/step) when the client read late on a busy host; one pair per batch gave 0.4 ms/step
  at batch 8 once (a burst of other work on the short batch).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.served_model import ServedModel
from prfaas.models.kv import geometry
from prfaas.models.profile import MeasuredProfile

DEFAULT_LENGTHS = (256, 512, 1024, 2048, 3072)
DEFAULT_BATCHES = (1, 4, 8)
META_BYTES = 24  # token count, prompt fingerprint, layout fingerprint (int64 each)


VllmProfile = MeasuredProfile  # a vLLM instance's measurement


def connector_kv_bytes(model: ServedModel, length_tokens: int,
                       wire_dtype: str | None = None) -> int:
    """Bytes PrfaasConnector ships for a prompt of `length_tokens` (module docstring), its
    full-attention KV in `wire_dtype` (fp8: codes and scales; None: as cached)."""
    if length_tokens < 1:
        raise ConfigError("length_tokens", length_tokens, "must be >= 1")
    geo = geometry(model.to_spec()).on_wire(wire_dtype)
    backoff = 1 if geo.linear_state_bytes > 0 and length_tokens > 1 else 0
    sent = length_tokens - backoff
    block = model.block_size_tokens
    blocks = -(-sent // block)
    return round(blocks * block * geo.kv_bytes_per_token + geo.linear_state_bytes + META_BYTES)


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def _ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(3, vocab, n)]  # 0-2: bos/eos/pad


def measure_prefill(url: str, model: ServedModel, lengths: tuple[int, ...], reps: int,
                    rng: np.random.Generator, timeout_s: float = 300.0
                    ) -> list[tuple[int, float]]:
    vocab = model.tokenizer().vocab_size
    body = {"model": model.name, "max_tokens": 1, "temperature": 0.0}
    _post(url, {**body, "prompt": _ids(rng, min(lengths), vocab)}, timeout_s)  # warm-up
    # lengths interleaved, `reps` rounds (as engine/profiler.py): a slow spell of the host
    # lands on one round of every length, not on every rep of the lengths timed during it
    times: dict[int, list[float]] = {n: [] for n in lengths}
    for _ in range(reps):
        for n in lengths:
            t0 = time.perf_counter()
            _post(url, {**body, "prompt": _ids(rng, n, vocab)}, timeout_s)
            times[n].append(time.perf_counter() - t0)
    return [(n, statistics.median(times[n])) for n in lengths]


async def _batch_wall_s(url: str, bodies: list[dict[str, Any]], timeout_s: float
                        ) -> list[float]:
    """Each request's wall time, all sent at once (non-streaming: a client that reads late
    cannot compress the timings, as streamed chunks read under CPU contention were)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def one(body: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                resp.raise_for_status()
                await resp.read()
            return time.perf_counter() - t0

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def step_s(wall_long_s: list[float], wall_short_s: list[float], extra_tokens: int) -> float:
    """Seconds per decode step: the median wall time of the batch generating 1 + extra_tokens
    tokens minus that of the same batch generating 1, over the extra tokens."""
    if extra_tokens < 1:
        raise ConfigError("decode_steps", extra_tokens + 1, "must be >= 2")
    return max(statistics.median(wall_long_s) - statistics.median(wall_short_s), 0.0) \
        / extra_tokens


def _decode_batch(url: str, model: ServedModel, batch: int, context_tokens: int,
                  steps: int, rng: np.random.Generator, timeout_s: float, reps: int) -> float:
    vocab = model.tokenizer().vocab_size

    def bodies(max_tokens: int) -> list[dict[str, Any]]:
        return [{"model": model.name, "prompt": _ids(rng, context_tokens, vocab),
                 "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
                for _ in range(batch)]

    # short and long batches alternate, `reps` pairs: a burst of other work on the host
    # inflates one batch's wall time, and the median of the pairs' steps keeps it out
    per_pair = []
    for _ in range(reps):
        short = asyncio.run(_batch_wall_s(url, bodies(1), timeout_s))
        long = asyncio.run(_batch_wall_s(url, bodies(steps), timeout_s))
        per_pair.append(step_s(long, short, steps - 1))
    return statistics.median(per_pair)


def measure_decode(url: str, model: ServedModel, batches: tuple[int, ...], context_tokens: int,
                   steps: int, rng: np.random.Generator, reps: int = 3,
                   timeout_s: float = 300.0) -> list[tuple[int, float]]:
    return [(b, _decode_batch(url, model, b, context_tokens, steps, rng, timeout_s, reps))
            for b in batches]


def run_profile(url: str, model: ServedModel, lengths: tuple[int, ...] = DEFAULT_LENGTHS,
                batches: tuple[int, ...] = DEFAULT_BATCHES, reps: int = 2,
                context_tokens: int = 256, decode_steps: int = 64, seed: int = 0
                ) -> VllmProfile:
    if max(lengths) >= model.max_context_tokens:
        raise ConfigError("lengths", max(lengths),
                          f"must be below max_model_len {model.max_context_tokens}")
    rng = np.random.default_rng(seed)
    prefill = measure_prefill(url, model, lengths, reps, rng)
    decode = measure_decode(url, model, batches, context_tokens, decode_steps, rng,
                            max(reps, 3))
    kv = [(n, connector_kv_bytes(model, n)) for n in lengths]
    return VllmProfile(tuple(prefill), tuple(kv), tuple(decode), reps, context_tokens)


def _model_type(model: ServedModel) -> str:
    path = Path(model.model_dir) / "config.json"
    return str(json.loads(path.read_text()).get("model_type", "model")) if path.is_file() \
        else "model"


def profile_document(model: ServedModel, prof: VllmProfile, hardware: str, where: str
                     ) -> dict[str, Any]:
    """The profile in the planner's YAML format (models/profile_file.py)."""
    kv_dtype, state_dtype = model.dtypes()
    how = (f"prfaas profile --engine vllm: client wall time of a max_tokens=1 completion of a "
           f"fresh random token-id prompt (median of {prof.reps} rounds over the lengths after a "
           f"warm-up; prefill + one "
           f"token + loopback HTTP); S_kv = PrfaasConnector's layout (whole "
           f"{model.block_size_tokens}-token blocks of the attention layers for l-backoff "
           f"tokens, {kv_dtype} KV, {state_dtype} recurrent state once, meta); decode step = "
           f"(median wall of b concurrent {prof.context_tokens}-token prompts generating n "
           f"tokens - generating 1) / (n - 1), median of >= 3 pairs; instance: {where}; "
           f"vLLM args: {' '.join(model.args)}; {dt.datetime.now(dt.UTC).date().isoformat()}")
    return prof.document(f"vllm-{_model_type(model)}", hardware, model.to_spec().name, how)


def profile_topology(topology: Any, url: str | None = None, log_dir: str | None = None,
                     **kwargs: Any) -> dict[str, Any]:
    """The profile document of the topology's vLLM instances: measured on `url` (a running
    instance serving the topology's model), else on a standalone instance started here with
    the topology's engine arguments, pinned to the cores of its first prefill worker, with
    that worker's vLLM idle spin. When another prefill worker is pinned to those cores, a twin
    instance runs beside it (idle while T_prefill, S_kv and decode are measured, as the
    neighbour is in the deployment) and the two measure the `core_sharing` factor
    (core_sharing.py)."""
    import tempfile

    from prfaas.engine.profiler import cpu_model
    from prfaas.integrations.vllm.deploy import (
        gpu_memory_utilization,
        idle_spin_s,
        prepare,
        settings,
    )
    from prfaas.integrations.vllm.reference import reference_spec
    from prfaas.integrations.vllm.server import VllmInstance
    from prfaas.serve.ports import free_port

    s = settings(topology)
    model = ServedModel.from_settings(s)
    if url is not None:
        prof = run_profile(url.rstrip("/"), model, **kwargs)
        return profile_document(model, prof, f"{cpu_model()} (instance at {url})", url)
    prepare(topology)
    first = next((w for w in topology.workers if w.role in ("prfaas", "pd-p")), None)
    cores = first.cores if first else None
    # as that worker runs in the deployment: its cores and its vLLM idle spin (deploy.py)
    spec = reference_spec(s, free_port(), cores, idle_spin_s(topology, first) if first else None,
                          first.gpus if first else (),
                          gpu_memory_utilization(topology, first) if first else None)
    logs = Path(log_dir or tempfile.mkdtemp(prefix="prfaas-profile-"))
    twin = VllmInstance(replace(spec, port=free_port()), logs / "vllm-profile-twin.log") \
        if first is not None and _shares_cores(topology, first.name) else None
    sharing = None
    if twin is not None:
        twin.spawn()  # both start at once
    try:
        with VllmInstance(spec, logs / "vllm-profile.log") as inst:
            if twin is not None:
                twin.wait_ready()
            prof = run_profile(inst.spec.url, model, **kwargs)
            if twin is not None:
                from prfaas.integrations.vllm import core_sharing

                sharing = core_sharing.measure(inst.spec.url, twin.spec.url, model, cores or "")
    finally:
        if twin is not None:
            twin.stop()
    hardware = f"{cpu_model()}, cores {cores or 'all'}"
    where = f"standalone, cores {cores or 'all'}" + (
        ", beside an idle twin on the same cores" if twin is not None else "")
    doc = profile_document(model, prof, hardware, where)
    if sharing is not None:
        doc["core_sharing"] = sharing
    return doc


def _shares_cores(topology: Any, name: str) -> bool:
    """Another prefill worker is pinned to cores `name`'s overlap (serve/cores.py)."""
    from prfaas.serve.cores import shared_core_groups

    prefill = [w for w in topology.workers if w.role in ("prfaas", "pd-p")]
    return any(name in group for group in shared_core_groups(prefill))
