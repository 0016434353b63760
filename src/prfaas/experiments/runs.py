"""One workload through the live emulated deployment and through the simulator.

Both sides get the same `Workload` (the scaled scenario's lengths, uniform arrivals,
stratified draws, a seed): live, `bench.loadgen` sends request i at arrival_s[i] with a prompt
of input_tokens[i] tokens (BOS + random letters) and max_tokens = output_tokens[i]; simulated,
`sim.run.simulate` on the system's SystemConfig. Each side yields per-request arrival, ready
and finish times, judged by probe.judge. "Ready" is one event on both sides: the request's KV
held by its decoder, whose first token is then sampled (simulator: `kv_ready_s`; live: the
decode worker's wall-clock stamp `kv_ready_unix_s`, placed on the client's timeline by the
client's wall clock at sending: one host, one clock). Live runs keep the client's first token
too (`client_ready_s`, for reference), measure the CPU our processes used (utime + stime from
/proc) against the two cores, and the KV bytes that crossed the inter-DC link.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prfaas.bench.loadgen import Result, run_load
from prfaas.bench.workload import BenchRequest
from prfaas.experiments.probe import ProbeResult, judge
from prfaas.serve.deploy.launcher import Deployment
from prfaas.sim.run import simulate
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import Workload, synthetic

_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
REQUEST_TIMEOUT_S = 900.0


@contextlib.contextmanager
def deployed(topology: Any, log_dir: Any = None) -> Iterator[Deployment]:
    """A started Deployment, stopped afterwards; a stop that times out on a loaded host (a
    killed process not yet reaped) is reported, not raised, so the measured runs are kept."""
    dep = Deployment(topology, log_dir, start_timeout_s=300.0)
    dep.start()
    try:
        yield dep
    finally:
        try:
            dep.stop()
        except subprocess.TimeoutExpired as exc:
            print(f"warning: stopping the deployment: {exc}", file=sys.stderr)


def probe_workload(lengths: Any, output_tokens: int, rate_rps: float, n: int, seed: int
                   ) -> Workload:
    return synthetic(lengths, output_tokens, make_arrivals("uniform"), rate_rps, n, seed,
                     stratified=True)


@dataclass
class RunRecord:
    """Per-request times (s from the run's start) and where each went."""

    result: ProbeResult
    arrival_s: np.ndarray
    ready_s: np.ndarray
    finish_s: np.ndarray
    remote: np.ndarray  # bool: prefilled in the PrfaaS cluster
    link_bytes: float  # KV over the inter-DC link
    span_s: float
    kv_bytes: np.ndarray | None = None  # per request KV bytes shipped
    cpu_share: float | None = None  # our processes' CPU / (wall x cores), live only
    loadavg: float | None = None
    errors: int = 0
    error_samples: tuple[str, ...] = ()  # live: up to 3 distinct failure messages
    shed: int = 0  # live: of the errors, refused with 429/503 (never accepted)
    offered: np.ndarray | None = None  # bool: the policy sent it to PrfaaS first (live:
    # `first_route`, before any retry moved it local; simulated: `remote`)
    client_ready_s: np.ndarray | None = None  # live: the client's first token


def simulated(cfg: SystemConfig, workload: Workload) -> RunRecord:
    return from_sim(simulate(cfg, workload)[0], workload)


def from_sim(sim: Any, workload: Workload) -> RunRecord:
    log = sim.log
    arrival, ready = np.asarray(log.arrival_s), np.asarray(log.kv_ready_s)
    finish = np.asarray(log.finish_s)
    return RunRecord(judge(workload.offered_rps(), arrival, ready, finish), arrival, ready,
                     finish, np.asarray(log.remote, dtype=bool), float(sim.link.bytes_sent),
                     float(np.nanmax(finish) - arrival.min()), np.asarray(log.kv_bytes),
                     offered=np.asarray(log.remote, dtype=bool))


def prompts(workload: Workload, seed: int) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    return [BenchRequest(_LETTERS[rng.integers(0, _LETTERS.size, int(n) - 1)].tobytes().decode(),
                         int(o)) for n, o in zip(workload.input_tokens, workload.output_tokens,
                                                 strict=True)]


def _cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def live(url: str, model: str, workload: Workload, pids: list[int], seed: int) -> RunRecord:
    reqs = prompts(workload, seed)
    me = [os.getpid()]
    cpu0, t0, load0 = _cpu_s(pids + me), time.perf_counter(), os.getloadavg()[0]
    results: list[Result] = asyncio.run(run_load(url, model, reqs,
                                                 [float(a) for a in workload.arrival_s],
                                                 timeout_s=REQUEST_TIMEOUT_S))
    wall = time.perf_counter() - t0
    cpu = (_cpu_s(pids + me) - cpu0) / (wall * (os.cpu_count() or 1))
    nan = float("nan")
    arrival = np.array([r.sent_s for r in results])
    ready = np.array([_kv_ready_s(r) for r in results])
    if any(r.ok for r in results) and not np.isfinite(ready).any():
        raise RuntimeError("no live request carried the decoder's kv_ready_unix_s stamp: "
                           "the capacity search cannot judge this backend")
    client_ready = np.array([r.sent_s + r.ttft_s if r.ok and r.ttft_s is not None else nan
                             for r in results])
    finish = np.array([r.sent_s + r.e2e_s if r.ok and r.e2e_s is not None else nan
                       for r in results])
    remote = np.array([r.prfaas.get("route") == "prfaas" for r in results], dtype=bool)
    offered = np.array([r.first_route == "prfaas" for r in results], dtype=bool)
    kv = np.array([float(r.prfaas.get("kv_bytes", 0) or 0) for r in results])
    link = float(kv[remote].sum())
    return RunRecord(judge(workload.offered_rps(), arrival, ready, finish), arrival, ready,
                     finish, remote, link, float(np.nanmax(finish) - arrival.min())
                     if np.isfinite(finish).any() else wall, kv, cpu,
                     round((load0 + os.getloadavg()[0]) / 2, 2),
                     sum(1 for r in results if not r.ok),
                     tuple(sorted({r.error[:160] for r in results if not r.ok})[:3]),
                     sum(1 for r in results if r.status in (429, 503)), offered, client_ready)


def _kv_ready_s(r: Result) -> float:
    """The decoder's KV-ready stamp on the run's timeline; nan when the request failed or the
    backend gave no stamp (then the probe is judged not sustained: nothing is guessed)."""
    stamp = r.prfaas.get("kv_ready_unix_s")
    if not r.ok or not isinstance(stamp, (int, float)):
        return float("nan")
    return r.sent_s + (float(stamp) - r.sent_unix_s)
