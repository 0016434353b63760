"""The live world: the started deployment's model and ports, its idle points, and a load
replayed through its router with a time limit (a load that cannot reach its request count in
its time stops the run with one line saying which load and why)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import PrfaasError
from prfaas.experiments.sim_vs_live.compare import Side
from prfaas.models.profile_file import read_profile_file
from prfaas.workload.requests import Workload


class LoadIncomplete(PrfaasError):
    """A load did not complete all its requests within its time limit."""


def served_model(url: str) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def free_ports(topology: Any) -> Any:
    return replace(topology, router_port=0, workers=tuple(
        replace(w, port=0, kv_port=0) for w in topology.workers))


def deployment_idle_points(url: str, model: str, profile: Path, max_context_tokens: int,
                           vocab_size: int, block_tokens: int) -> list[dict[str, Any]]:
    """The idle points on the deployment under test (already warmed), at the profile's
    prefill lengths less half a cache block (`idle_routes.usable_lengths`): what `prfaas
    profile` measures on a deployment of its own, minutes earlier (experiments/idle_routes.py)."""
    from prfaas.experiments import idle_routes as idle

    usable = idle.usable_lengths([int(p["length_tokens"]) for p in
                                  read_profile_file(profile)["prefill"]["points"]],
                                 max_context_tokens, block_tokens)
    points = idle.measure_on(url, model, usable, vocab_size, idle.REPS, seed=11, warm=False)
    if not points:  # (a failed request leaves no point): no calibration would be a silent change
        raise PrfaasError(f"idle points: none of {len(usable) * idle.REPS} lone requests "
                          f"through {url} succeeded; see the deployment's logs")
    return points


def _num(value: Any) -> float | None:
    return round(float(value), 4) if isinstance(value, (int, float)) else None


def live_side(url: str, model: str, workload: Workload, vocab_size: int, seed: int,
              limit_s: float | None = None) -> tuple[Side, dict[str, Any]]:
    """The workload through the router, each request sent at its arrival time; `limit_s`:
    none runs past that many seconds from the first arrival."""
    import asyncio

    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest

    rng = np.random.default_rng(seed)
    reqs = [BenchRequest([int(t) for t in rng.integers(3, vocab_size, int(n))], int(o))
            for n, o in zip(workload.input_tokens, workload.output_tokens, strict=True)]
    load0 = os.getloadavg()[0]
    results = asyncio.run(run_load(url, model, reqs, [float(a) for a in workload.arrival_s],
                                   timeout_s=900.0, deadline_s=limit_s))
    nan = float("nan")
    arrival = np.array([r.sent_s for r in results])
    ttft = np.array([r.ttft_s if r.ok and r.ttft_s is not None else nan for r in results])
    finish = np.array([r.sent_s + r.e2e_s if r.ok and r.e2e_s is not None else nan
                       for r in results])
    remote = np.array([r.first_route == "prfaas" for r in results], dtype=bool)
    failed = [r for r in results if not r.ok]
    extra = {"errors": len(failed),
             "timed_out": sum(1 for r in failed if r.error.startswith("TimeoutError")),
             "error_samples": sorted({r.error[:160] for r in failed})[:3],
             "retried": sum(1 for r in results if r.prfaas.get("first_route")
                            and r.prfaas.get("first_route") != r.prfaas.get("route")),
             "loadavg_1m_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
             "kv_bytes": [int(r.prfaas.get("kv_bytes") or 0) if r.ok else None
                          for r in results],
             "kv_wire_bytes": [int(r.prfaas.get("kv_wire_bytes") or r.prfaas.get("kv_bytes")
                                   or 0) if r.ok else None for r in results],
             # the router's own account of the request (diagnosis only, never compared):
             # its prefill call's duration and its overhead outside the workers
             "prefill_s": [_num(r.prfaas.get("prefill_s")) for r in results],
             "router_overhead_s": [_num(r.prfaas.get("router_overhead_s")) for r in results]}
    return Side(arrival, ttft, finish, remote), extra


def incomplete_line(index: int, count: int, share: float, offered_rps: float,
                    extra: dict[str, Any], requests: int, limit_s: float) -> str | None:
    """None when the load completed every request; else one line: which load, and why."""
    failed = extra["errors"]
    if not failed:
        return None
    timed_out = extra["timed_out"]
    why = []
    if timed_out:
        why.append(f"{timed_out} still running at the limit (the deployment serves fewer "
                   f"requests per second than offered here)")
    if failed > timed_out:
        sample = next((e for e in extra["error_samples"] if not e.startswith("TimeoutError")),
                      "")
        why.append(f"{failed - timed_out} failed ({sample[:100]})")
    return (f"load {index + 1} of {count} ({share:.2f} of capacity, {offered_rps:.3f} req/s): "
            f"{requests - failed} of {requests} requests completed within its {limit_s:.0f} s; "
            + "; ".join(why))
