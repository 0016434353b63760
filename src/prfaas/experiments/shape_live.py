"""The shape controller's benchmark: a workload whose mix shifts, with the shape fixed and with
the controller, live (emulated engine on a Ray cluster) and simulated (the simulator with the
same policy objects on the same workload).

The workload (`phased_workload`): phases given in scenario units, each a truncated log-normal
input mix at a rate for a duration (uniform arrivals, stratified lengths, a seed per phase), put
end to end and scaled to live units (emulated/scales.py). Everything measured is in live units
(the emulated deployment's seconds). Per phase and run (`phase_figures`): throughput = requests
finished within the phase's time window / its length (what the deployment served while that
mix arrived), TTFT P50 / P90 of the requests that arrived in it (arrival -> KV at the decoder,
the same event on both sides, experiments/runs.py). The controller's gain (`gain`), fixed
before any run: its throughput in the phase whose mix the initial shape was not planned for
over the fixed shape's in that phase, minus 1; `within` checks the live gain against the
simulator's prediction for the same workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.emulated.scales import ScaledScenario, scale_lengths
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.requests import Workload, synthetic


@dataclass(frozen=True, slots=True)
class Phase:
    """One mix, in scenario units."""

    name: str
    median_tokens: float
    sigma: float
    rate_rps: float
    duration_s: float

    def __post_init__(self) -> None:
        for key in ("median_tokens", "sigma", "rate_rps", "duration_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"phase.{key}", getattr(self, key), "must be positive")


@dataclass(frozen=True)
class PhasedWorkload:
    workload: Workload  # live units
    starts_s: tuple[float, ...]  # each phase's first live second (the last: its end)
    phases: tuple[Phase, ...]

    def phase_of(self, arrival_s: np.ndarray) -> np.ndarray:
        """Index of the phase each (live) arrival time falls in."""
        return np.clip(np.searchsorted(self.starts_s, arrival_s, side="right") - 1, 0,
                       len(self.phases) - 1)


def phased_workload(scaled: ScaledScenario, phases: Sequence[Phase], seed: int,
                    min_tokens: int = 128, max_tokens: int = 131072) -> PhasedWorkload:
    sc = scaled.scales
    out_tokens = scaled.scenario.output_tokens
    times, inputs, starts, t0 = [], [], [], 0.0
    for k, ph in enumerate(phases):
        rate = ph.rate_rps / sc.time  # live req/s
        span = ph.duration_s * sc.time  # live s
        n = max(round(rate * span), 1)
        lengths = scale_lengths(truncated_lognormal(float(np.log(ph.median_tokens)), ph.sigma,
                                                    min_tokens, max_tokens), sc.tokens)
        w = synthetic(lengths, out_tokens, make_arrivals("uniform"), rate, n, seed + k,
                      stratified=True)
        starts.append(t0)
        times.append(w.arrival_s - w.arrival_s[0] + t0)
        inputs.append(w.input_tokens)
        t0 += span
    starts.append(t0)
    arrival = np.concatenate(times)
    ins = np.concatenate(inputs)
    work = Workload(arrival, ins, np.full(ins.size, out_tokens, dtype=np.int64),
                    " -> ".join(f"{p.name} {p.rate_rps:g} req/s" for p in phases))
    return PhasedWorkload(work, tuple(starts), tuple(phases))


def run_throughput_rps(arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """Completed requests / (last finish - first arrival); 0 when none completed."""
    ok = np.isfinite(finish_s)
    if not ok.any():
        return 0.0
    span = float(finish_s[ok].max() - arrival_s.min())
    return float(ok.sum()) / span if span > 0 else 0.0


def phase_figures(pw: PhasedWorkload, arrival_s: np.ndarray, ready_s: np.ndarray,
                  finish_s: np.ndarray, time_scale: float) -> list[dict[str, Any]]:
    """Per phase: throughput = requests finished within the phase's window / its length
    (scenario req/s), TTFT P50 / P90 of the requests that arrived in it (scenario s)."""
    which = pw.phase_of(pw.workload.arrival_s)
    out = []
    for k, ph in enumerate(pw.phases):
        lo, hi = pw.starts_s[k], pw.starts_s[k + 1]
        mine = which == k
        ttft = (ready_s - arrival_s)[mine]
        ttft = ttft[np.isfinite(ttft)]
        done = int(((finish_s >= lo) & (finish_s < hi)).sum())
        out.append({"name": ph.name, "requests": int(mine.sum()),
                    "completed": int(np.isfinite(finish_s[mine]).sum()),
                    "throughput_rps": round(done / (hi - lo) * time_scale, 4),
                    "ttft_p50_s": _pct(ttft, 50, time_scale),
                    "ttft_p90_s": _pct(ttft, 90, time_scale)})
    return out


def _pct(values: np.ndarray, q: float, time_scale: float) -> float | None:
    return None if values.size == 0 else round(float(np.percentile(values, q)) / time_scale, 4)


def gain(fixed_rps: float, controlled_rps: float) -> float:
    """The controller's gain: its throughput over the fixed shape's, minus 1."""
    if not fixed_rps > 0:
        raise ConfigError("fixed throughput", fixed_rps, "must be positive to compare with")
    return controlled_rps / fixed_rps - 1.0


def within(live_gain: float, sim_gain: float, rel_tol: float = 0.10) -> bool:
    """|live - sim| <= rel_tol x |sim|: a gain of 0 live never agrees with a predicted one."""
    return abs(live_gain - sim_gain) <= rel_tol * abs(sim_gain)


def scaled_phases(phases: Sequence[Phase], factor: float) -> tuple[Phase, ...]:
    """The same phases, each `factor` x as long (--quick)."""
    return tuple(replace(p, duration_s=p.duration_s * factor) for p in phases)


# -- the two worlds -------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One run (live or simulated) of the workload: per-request times in live seconds from the
    first arrival, the role changes, and for live runs the replies' tokens."""

    arrival_s: np.ndarray
    ready_s: np.ndarray
    finish_s: np.ndarray
    role_changes: list[dict[str, Any]]
    lost: int = 0  # accepted and not completed (live: failed replies other than a 429)
    token_ids: list[list[int]] | None = None  # live: each reply's tokens
    nodes: list[tuple[str, str]] | None = None  # live: each reply's (prefill, decode) node
    extra: dict[str, Any] | None = None
    shed: int = 0  # live: refused at admission (429, the router's queue limit), never accepted


def sim_topology_router(topology: Any) -> Any:
    """The router the live deployment builds from the topology (serve/router/service.py)."""
    from prfaas.serve.router.service import build_policy

    return build_policy(topology)


def simulate_run(es: Any, topology: Any, pw: PhasedWorkload,
                 shape: Any | None) -> Outcome:
    """The simulator on the emulated system (its split, the topology's policy object), with
    the shape controller's plugin when `shape` (a ShapeConfig) is given."""
    from prfaas.emulated.backend import emulated_plan_inputs
    from prfaas.policy.shape import ShapeController
    from prfaas.sim.shape import ShapePlugin
    from prfaas.sim.simulator import Simulator

    plugins = []
    if shape is not None:
        plugins.append(ShapePlugin(ShapeController(emulated_plan_inputs(topology), shape)))
    sim = Simulator(es.sim_config, pw.workload, sim_topology_router(topology),
                    plugins=plugins).run()
    log = sim.log
    changes = []
    for r in (plugins[0].records if plugins else []):
        changes.append({"at_s": round(r.time_s, 3), "instance": r.instance,
                        "from": WORKER_ROLE[r.from_role], "to": WORKER_ROLE[r.to_role],
                        "reason": r.reason, "drain_s": None if r.drained_s is None
                        else round(r.drained_s - r.time_s, 3),
                        "switch_s": None if r.ready_s is None or r.drained_s is None
                        else round(r.ready_s - r.drained_s, 3)})
    finish = np.asarray(log.finish_s, dtype=float)
    lost = int((~np.asarray(log.rejected, dtype=bool) & ~np.isfinite(finish)).sum())
    return Outcome(np.asarray(log.arrival_s, dtype=float), np.asarray(log.kv_ready_s,
                                                                       dtype=float),
                   finish, changes, lost)


WORKER_ROLE = {"prefill": "pd-p", "decode": "pd-d"}


def pd_topology(es: Any, shape: Any | None) -> Any:
    """The emulated system's topology for Ray: PD workers named pd-0.. (a name outlives a
    role), every one with the decoders' batch slots, the link a token bucket (a kernel-shaped
    namespace is the embedded launcher's), the router on a free port; `shape` on or off."""
    from prfaas.serve.topology import WorkerSpec

    slots = max(w.max_batch for w in es.topology.workers if w.role == "pd-d")
    workers, k = [], 0
    for w in es.topology.workers:
        if w.role == "prfaas":
            workers.append(w)
            continue
        workers.append(WorkerSpec(f"pd-{k}", w.role, max_batch=slots, engine=w.engine))
        k += 1
    link = replace(es.topology.link, emulation="token-bucket")
    return replace(es.topology, workers=tuple(workers), link=link, shape=shape, router_port=0)


def live_run(address: str, topology: Any, pw: PhasedWorkload, model: str, seed: int,
             log_dir: str | None = None, tick: Any = print) -> Outcome:
    """The workload through a RayDeployment of `topology` on the cluster at `address`
    (streaming, greedy, ignore_eos; TTFT = KV at the decoder, runs.py's stamp)."""
    import asyncio
    import json
    import os
    import time
    import urllib.request

    from prfaas.bench.loadgen import run_load
    from prfaas.experiments.runs import REQUEST_TIMEOUT_S, _kv_ready_s, prompts
    from prfaas.serve.deploy.ray.deployment import RayDeployment
    from prfaas.serve.deploy.ray.spec import RaySpec

    def get(url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=30) as resp:
            out: dict[str, Any] = json.load(resp)
            return out

    reqs = prompts(pw.workload, seed)
    arrivals = [float(a) for a in pw.workload.arrival_s]
    load0 = os.getloadavg()[0]
    with RayDeployment(topology, RaySpec(), address, start_timeout_s=300,
                       log_dir=log_dir) as dep:
        tick(f"deployment up at {dep.url} ({'controlled' if topology.shape else 'fixed'})")
        router0 = get(f"{dep.url}/shape")["now_s"] if topology.shape else 0.0
        t0 = time.perf_counter()
        results = asyncio.run(run_load(dep.url, model, reqs, arrivals,
                                       timeout_s=REQUEST_TIMEOUT_S))
        wall_s = time.perf_counter() - t0
        shape = get(f"{dep.url}/shape") if topology.shape else None
        executor = list(dep.executor.log) if dep.executor is not None else []
        members = get(f"{dep.url}/health")["members"]
    arrival = np.array([r.sent_s for r in results])
    ready = np.array([_kv_ready_s(r) for r in results])
    finish = np.array([r.sent_s + r.e2e_s if r.ok and r.e2e_s is not None else np.nan
                       for r in results])
    changes = []
    for h in (shape or {}).get("history", []):
        restart = next((e["restart_s"] for e in executor if e["instance"] == h["instance"]
                        and e["to"] == h["to"]), None)
        changes.append({"at_s": round(h["at_s"] - router0, 3), "instance": h["instance"],
                        "from": h["from"], "to": h["to"], "reason": h["reason"],
                        "drain_s": h["drain_s"], "switch_s": h["switch_s"],
                        "restart_s": restart, "ok": h["ok"], "detail": h["detail"],
                        "ended_s": round(h["ended_s"] - router0, 3)})
    shed = sum(1 for r in results if r.status == 429)
    lost = sum(1 for r in results if not r.ok and r.status != 429)
    return Outcome(arrival, ready, finish, changes, lost,
                   [list(r.prfaas.get("token_ids", [])) for r in results],
                   [(str(r.prfaas.get("prefill_node", "")), str(r.prfaas.get("decode_node", "")))
                    for r in results],
                   {"wall_s": round(wall_s, 1), "loadavg_1m": [round(load0, 2),
                                                               round(os.getloadavg()[0], 2)],
                    "errors": sorted({r.error[:160] for r in results if not r.ok})[:3],
                    "refusals": (shape or {}).get("controller", {}).get("refusals", []),
                    "outcomes": (shape or {}).get("controller", {}).get("outcomes", {}),
                    "members": {n: {k: m.get(k) for k in ("role", "role_changes", "restarts")}
                                for n, m in members.items()}}, shed=shed)


def caught_in_changes(out: Outcome) -> list[int]:
    """Requests in flight on an instance when its change began (the drain waited for them)."""
    assert out.nodes is not None
    caught = []
    for ch in out.role_changes:
        for i, (pre, dec) in enumerate(out.nodes):
            if ch["instance"] in (pre, dec) and out.arrival_s[i] <= ch["at_s"] and (
                    not np.isfinite(out.finish_s[i]) or out.finish_s[i] >= ch["at_s"]):
                caught.append(i)
    return sorted(set(caught))


def check_texts(out: Outcome, pw: PhasedWorkload, seed: int, reference: Any,
                indices: list[int]) -> dict[str, Any]:
    """The replies' tokens at `indices` against the emulated engine's single-process
    `generate` of the same prompts (what `prfaas generate` is for the native engine)."""
    from prfaas.experiments.runs import prompts

    assert out.token_ids is not None
    reqs = prompts(pw.workload, seed)
    equal = 0
    for i in indices:
        ids = reference.tokenizer.encode(reqs[i].prompt)
        equal += int(out.token_ids[i] == reference.generate(ids, reqs[i].max_tokens))
    return {"compared": len(indices), "equal": equal}
