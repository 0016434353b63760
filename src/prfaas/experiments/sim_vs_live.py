"""`prfaas sim-vs-live`: one Poisson workload, at two or more loads, through a topology's live
deployment and through the simulator built from a measured profile, compared per request.

The two sides share the workload (arrival times, prompt lengths, output lengths) and the policy
builder (`serve.router.service.build_policy(topology)`: the live router and the simulator each
hold one such object), nothing else:
- live: the topology is started (`Deployment`, free ports), and `bench.loadgen` replays the
  arrivals with fresh random token-id prompts (no prefix hit), streaming, greedy, ignore_eos.
  TTFT is the client's: request sent -> first streamed token. The load generator runs on the
  router's `cores` when the topology pins the router (a deployment's clients are not on its
  prefill instances' cores). The route is the router's first decision (`first_route`, before
  any retry moved the request local). Finish = last byte.
- sim: `Simulator` on the system the profile describes (hardware, S_kv(l), decode steps), the
  topology's instance counts, link rate and connections. TTFT is `kv_ready_s - arrival_s` (the
  request's KV held by its decoder, whose first token is then sampled), plus its route's fixed
  overhead when the profile has idle-deployment points (`idle_ttft`, experiments/idle_routes.py:
  median idle TTFT minus the simulator's for the same lone request), routes from the log.
  Prefill workers the topology pins to shared cores slow each other while their prefills
  overlap (`core_sharing`: sim/sharing.py, by the profile's measured factor, else 2.0).
Per load: `ttft_mape` = mean over requests completed on both sides of |sim - live| / live;
`throughput_*_rps` = completed requests / (last finish - first arrival), each side on its own
times; `route_agreement` = share of requests both sides sent the same way. The loads are fixed
fractions of the planner's capacity for this deployment at the topology's t (planner.throughput
on the same profile), chosen before any run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError, PrfaasError
from prfaas.models.profile_file import load_profile_file, read_profile_file
from prfaas.serve.cores import pinned_thread
from prfaas.workload.lengths import LengthDistribution, truncated_lognormal
from prfaas.workload.requests import Workload

GOAL = {"ttft_mape_max": 0.15, "throughput_rel_err_max": 0.05, "route_agreement_min": 0.95}


@dataclass(frozen=True)
class Options:
    requests: int  # per load
    load_fractions: tuple[float, ...]  # of the planner's capacity at the topology's t
    seed: int = 2026
    median_tokens: int = 1000
    sigma: float = 0.7
    min_tokens: int = 64
    max_tokens: int = 3500  # clipped to the model's context minus the longest output
    output_range: tuple[int, int] = (16, 32)
    # unmeasured requests through the fresh deployment before the first load
    # (idle_routes.warm_up)
    warmup_requests: int = 8
    # the route overheads' idle points: measured on the loads' own deployment just before the
    # first load (True), or read from the profile (False: its `idle_ttft`, if any)
    idle_points_on_deployment: bool = True

    def __post_init__(self) -> None:
        if self.requests < 4:
            raise ConfigError("requests", self.requests, "must be >= 4")
        if self.warmup_requests < 0:
            raise ConfigError("warmup_requests", self.warmup_requests, "must be >= 0")
        if len(self.load_fractions) < 2 or min(self.load_fractions) <= 0:
            raise ConfigError("load_fractions", self.load_fractions,
                              "need at least two positive loads")


QUICK = Options(requests=24, load_fractions=(0.25, 0.5))
FULL = Options(requests=60, load_fractions=(0.25, 0.5, 0.75))


# -- the comparison (pure: unit-tested with a negative control) -------------------------------

@dataclass(frozen=True)
class Side:
    """Per-request outcome of one world, in request order (seconds from the run's start)."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray  # nan where the request failed
    finish_s: np.ndarray  # nan where the request failed
    remote: np.ndarray  # bool: sent to the PrfaaS cluster by the policy

    @property
    def ok(self) -> np.ndarray:
        return np.isfinite(self.ttft_s) & np.isfinite(self.finish_s)


def ttft_mape(live: Side, sim: Side) -> float | None:
    ok = live.ok & sim.ok & (live.ttft_s > 0)
    if not ok.any():
        return None
    return float(np.mean(np.abs(sim.ttft_s[ok] - live.ttft_s[ok]) / live.ttft_s[ok]))


def throughput_rps(side: Side) -> float:
    ok = side.ok
    if not ok.any():
        return 0.0
    span = float(side.finish_s[ok].max() - side.arrival_s.min())
    return float(ok.sum()) / span if span > 0 else 0.0


def route_agreement(live: Side, sim: Side) -> float:
    if live.remote.size != sim.remote.size or live.remote.size == 0:
        raise ConfigError("route_agreement", (live.remote.size, sim.remote.size),
                          "the two sides must hold the same non-empty workload")
    return float(np.mean(live.remote == sim.remote))


def _pcts(values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    return {} if v.size == 0 else {"p50": round(float(np.percentile(v, 50)), 4),
                                   "p90": round(float(np.percentile(v, 90)), 4),
                                   "mean": round(float(v.mean()), 4)}


def _subset(side: Side, keep: np.ndarray) -> Side:
    return Side(side.arrival_s[keep], side.ttft_s[keep], side.finish_s[keep], side.remote[keep])


def load_entry(offered_rps: float, live: Side, sim: Side) -> dict[str, Any]:
    mape = ttft_mape(live, sim)
    by_route = {}
    for route, keep in (("prfaas", live.remote), ("pd", ~live.remote)):
        m = ttft_mape(_subset(live, keep), _subset(sim, keep)) if keep.any() else None
        by_route[route] = None if m is None else round(m, 4)
    both = live.ok & sim.ok & (live.ttft_s > 0)
    bias = (float(np.mean((sim.ttft_s[both] - live.ttft_s[both]) / live.ttft_s[both]))
            if both.any() else None)
    thr_live, thr_sim = throughput_rps(live), throughput_rps(sim)
    return {
        "offered_rps": round(offered_rps, 5), "requests": int(live.arrival_s.size),
        "ttft_mape": None if mape is None else round(mape, 4),
        "throughput_live_rps": round(thr_live, 5), "throughput_sim_rps": round(thr_sim, 5),
        "route_agreement": round(route_agreement(live, sim), 4),
        "ttft_bias": None if bias is None else round(bias, 4),
        "ttft_mape_by_live_route": by_route,
        "throughput_rel_err": round(abs(thr_sim - thr_live) / thr_live, 4) if thr_live else None,
        "completed_live": int(live.ok.sum()), "completed_sim": int(sim.ok.sum()),
        "offload_live": round(float(live.remote.mean()), 4),
        "offload_sim": round(float(sim.remote.mean()), 4),
        "ttft_live_s": _pcts(live.ttft_s), "ttft_sim_s": _pcts(sim.ttft_s),
    }


def verdict(loads: list[dict[str, Any]]) -> dict[str, bool]:
    def every(pred: Callable[[dict[str, Any]], bool]) -> bool:
        return all(pred(x) for x in loads)

    return {"ttft_mape": every(lambda x: x["ttft_mape"] is not None
                               and x["ttft_mape"] <= GOAL["ttft_mape_max"]),
            "throughput": every(lambda x: x["throughput_rel_err"] is not None
                                and x["throughput_rel_err"] <= GOAL["throughput_rel_err_max"]),
            "route_agreement": every(lambda x: x["route_agreement"]
                                     >= GOAL["route_agreement_min"])}


# -- the deployment as a scenario --------------------------------------------------------------

def lengths_for(options: Options, max_context_tokens: int) -> LengthDistribution:
    hi = min(options.max_tokens, max_context_tokens - options.output_range[1] - 1)
    return truncated_lognormal(float(np.log(options.median_tokens)), options.sigma,
                               options.min_tokens, hi)


def _roles(topology: Any) -> dict[str, int]:
    out = {"prfaas": 0, "pd-p": 0, "pd-d": 0}
    for w in topology.workers:
        out[w.role] = out.get(w.role, 0) + 1
    if not (out["prfaas"] and out["pd-p"] and out["pd-d"]):
        raise ConfigError("workers", out, "sim-vs-live needs prfaas, pd-p and pd-d workers")
    return out


def scenario_dict(topology: Any, profile: Path, options: Options, max_context_tokens: int
                  ) -> dict[str, Any]:
    """The deployment as a scenario (`prfaas plan --scenario` reads it): every pool on the
    measured profile, the topology's instance counts and link (its transfers in the order
    the engine's workers send them, `EngineBackend.link_order`, each released to the link as
    they release it, `EngineBackend.kv_release`)."""
    from prfaas.serve.engines import engine_backend

    backend = engine_backend(topology)
    release = backend.kv_release()
    n = _roles(topology)
    pd = n["pd-p"] + n["pd-d"]
    hi = min(options.max_tokens, max_context_tokens - options.output_range[1] - 1)
    return {
        "name": f"{topology.name}-measured",
        "description": f"topology {topology.name} with the profile measured from its engine",
        "kv": {"profile": str(profile)},
        "hardware": {"measured": {"profile": str(profile)}},
        "clusters": {"prfaas": {"hardware": "measured", "instances": n["prfaas"]},
                     "pd": {"hardware": "measured", "instances": pd}},
        "baselines": {"homogeneous_pd": {"hardware": "measured", "instances": n["prfaas"] + pd},
                      "naive_heterogeneous": {
                          "prefill": {"hardware": "measured", "instances": n["prfaas"]},
                          "decode": {"hardware": "measured", "instances": pd}}},
        "link": {"gbps": topology.link.rate_gbps or 100.0,
                 "intra_gbps": topology.intra_link.rate_gbps or 100.0,
                 "connections": topology.link.connections, "pipelined": True,
                 "order": backend.link_order,
                 **({"release": release} if release is not None else {})},
        "workload": {"input": {"dist": "lognormal", "mu": float(np.log(options.median_tokens)),
                               "sigma": options.sigma, "min_tokens": options.min_tokens,
                               "max_tokens": hi},
                     "output_tokens": int(sum(options.output_range) // 2)},
        "planner": {"t_step_tokens": 64, "mode": "exact"},
    }


def planner_capacity_rps(lengths: LengthDistribution, profile: Path, t: int, n_prf: int,
                         n_p: int, link_gbps: float, sharing: dict[str, Any] | None = None
                         ) -> float:
    """The planner's Λmax for this split at a fixed t (Eq. 6's prefill terms, exact mode),
    and where prefill instances share cores (`sharing`: `core_sharing`'s groups), each shared
    core's own bound (`shared_core_capacity_rps`). The loads are fractions of this."""
    from prfaas.planner.throughput import bounds

    curves = _curves(lengths, profile, t)
    _, _, prf, pdp = bounds(curves, n_prf, n_p, link_gbps * 1e9 / 8)
    cap = float(min(prf[0], pdp[0]))
    shared = _shared_core_bound(curves, n_prf, n_p, sharing)
    return cap if shared is None else min(cap, shared)


def _curves(lengths: LengthDistribution, profile: Path, t: int) -> Any:
    from prfaas.planner.throughput import stage_curves

    hw = load_profile_file(profile)
    if hw.prefill is None:
        raise ConfigError("profile", str(profile), "has no prefill points")
    return stage_curves(lengths, np.array([float(t)]), hw.prefill, hw.prefill, hw.kv, "exact")


def shared_core_capacity_rps(lengths: LengthDistribution, profile: Path, t: int, n_prf: int,
                             n_p: int, sharing: dict[str, Any] | None) -> float | None:
    """The request rate the most loaded shared core can carry: its members' prefill work per
    request (an instance of a pool gets 1/n of that pool's requests, at their mean T(l)) at
    most what k concurrent prefills get through there, k / slowdown(k, f) (sim/sharing.py's
    law; 1.0 for two on one core at f = 2). None: no instances share cores. Without it two
    instances pinned to one core count as two machines: in stop 33's runs on an AVX2 host
    (prefill 0.89 s at 1K tokens) the "half load" filled 71% of core 0."""
    return _shared_core_bound(_curves(lengths, profile, t), n_prf, n_p, sharing)


def _shared_core_bound(c: Any, n_prf: int, n_p: int, sharing: dict[str, Any] | None
                       ) -> float | None:
    from prfaas.sim.sharing import slowdown

    if not sharing or not sharing.get("sim_groups"):
        return None
    groups, factor = sharing["sim_groups"], float(sharing["factor"])
    # a member's pool from its simulated id (sim/instances.py instance_id: pool + 4 digits)
    per_instance = {"prfaas-p": float(c.p_long[0] * c.long_service_s[0]) / max(n_prf, 1),
                    "pd-p": float(c.p_short[0] * c.short_service_s[0]) / max(n_p, 1)}
    caps = []
    for group in groups:
        work = sum(per_instance[m.rstrip("0123456789")] for m in group)
        if work > 0:
            caps.append(len(group) / slowdown(len(group), factor) / work)
    return min(caps) if caps else None


def workloads(options: Options, lengths: LengthDistribution, capacity_rps: float
              ) -> list[Workload]:
    """Common random numbers: one draw of gaps and lengths, its time axis rescaled per load."""
    rng = np.random.default_rng(options.seed)
    n = options.requests
    gaps = rng.exponential(1.0, n)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    inputs = lengths.sample(rng, n)
    outputs = rng.integers(options.output_range[0], options.output_range[1] + 1, n)
    return [Workload(arrival / (f * capacity_rps), inputs, outputs,
                     f"poisson {f * capacity_rps:.4f} req/s, {lengths.name}")
            for f in options.load_fractions]


def replay_workloads(result: dict[str, Any], max_context_tokens: int
                     ) -> tuple[Options, list[Workload]]:
    """A committed run's options and workloads rebuilt from its `sim_vs_live.json` (the same
    seed, lengths and arrivals), for re-simulating it; each workload is checked against the
    run's own per-request input lengths."""
    o = result["options"]
    options = Options(**{**o, "load_fractions": tuple(o["load_fractions"]),
                         "output_range": tuple(o["output_range"])})
    loads = workloads(options, lengths_for(options, max_context_tokens),
                      result["planner_capacity_rps"])
    for w, entry in zip(loads, result["loads"], strict=True):
        if [int(x) for x in w.input_tokens] != entry["per_request"]["input_tokens"]:
            raise ConfigError("sim_vs_live.json", entry["offered_rps"],
                              "the rebuilt workload's lengths are not the run's")
    return options, loads


def threshold_of(topology: Any) -> int:
    t = topology.policy_args.get("threshold_tokens")
    if t is None:
        raise ConfigError("policy.threshold_tokens", None,
                          f"topology {topology.name!r}: sim-vs-live needs the policy's t")
    return int(t)


# -- the two worlds ---------------------------------------------------------------------------

def core_sharing(topology: Any, profile: Path | None) -> dict[str, Any]:
    """The topology's prefill workers pinned to shared cores (serve/cores.py) as the
    simulator's instance groups, and the slowdown of two overlapping prefills there: the
    profile's measured `core_sharing.factor`, else 2.0 (pure processor sharing of one core).
    Decode workers sharing cores are listed, not modelled."""
    from prfaas.models.profile_file import core_sharing_factor
    from prfaas.serve.cores import shared_core_groups
    from prfaas.sim.instances import instance_id
    from prfaas.sim.sharing import PHYSICAL_FACTOR

    sim_id: dict[str, str] = {}
    for role, pool in (("prfaas", "prfaas-p"), ("pd-p", "pd-p")):
        for i, w in enumerate(w for w in topology.workers if w.role == role):
            sim_id[w.name] = instance_id(pool, i)
    prefill = [w for w in topology.workers if w.name in sim_id]
    groups = shared_core_groups(prefill)
    decode = [g for g in shared_core_groups(topology.workers)
              if any(n not in sim_id for n in g)]
    measured = core_sharing_factor(profile) if profile is not None and groups else None
    return {"groups": [list(g) for g in groups],
            "sim_groups": [[sim_id[n] for n in g] for g in groups],
            "factor": measured if measured is not None else PHYSICAL_FACTOR,
            "factor_source": "measured (profile core_sharing)" if measured is not None
            else "physical default (processor sharing, no measurement)" if groups
            else "unused (no prefill workers share cores)",
            "decode_sharing_not_modelled": [list(g) for g in decode]}


def simulate_side(topology: Any, scenario: dict[str, Any], workload: Workload, layers: int,
                  overheads_s: dict[str, float] | None = None,
                  sharing: dict[str, Any] | None = None) -> tuple[Side, dict[str, Any]]:
    from prfaas.planner.search import plan_all
    from prfaas.scenario import parse_scenario
    from prfaas.serve.router.service import build_policy
    from prfaas.sim.caching import CachePlugin
    from prfaas.sim.simulator import Simulator
    from prfaas.sim.system import build_system

    s = parse_scenario(scenario)
    n = _roles(topology)
    ov = overheads_s or {}
    cfg = build_system(s, "prfaas_pd", threshold_tokens=threshold_of(topology),
                       planned=plan_all(s, mode="exact"), n_p=n["pd-p"], n_d=n["pd-d"],
                       kv_layers=layers, local_overhead_s=ov.get("pd", 0.0),
                       remote_overhead_s=ov.get("prfaas", 0.0),
                       **({"core_groups": tuple(tuple(g) for g in sharing["sim_groups"]),
                           "core_share_factor": sharing["factor"]}
                          if sharing and sharing["sim_groups"] else {}))
    router = build_policy(topology)  # the live router's builder: one policy object per world
    cfg = replace(cfg, router=topology.policy)
    sim = Simulator(cfg, workload, router, plugins=[CachePlugin(None, workload)])
    sim.run()
    log = sim.log
    arrival = np.asarray(log.arrival_s, dtype=float)
    side = Side(arrival, np.asarray(log.kv_ready_s, dtype=float) - arrival,
                np.asarray(log.finish_s, dtype=float), np.asarray(log.remote, dtype=bool))
    return side, cfg.describe()


IDLE_GAP_S = 1000.0  # between the idle points' lone requests in the simulator


def idle_overheads(topology: Any, scenario: dict[str, Any], profile: Path, layers: int,
                   sharing: dict[str, Any] | None = None,
                   points: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Idle-deployment points (experiments/idle_routes.py; `points`, else the profile's)
    against the simulator's TTFT for each as a lone request: the per-route fixed overheads."""
    from prfaas.experiments.idle_routes import OUTPUT_TOKENS, route_overheads
    from prfaas.models.profile_file import idle_ttft_points

    points = idle_ttft_points(profile) if points is None else points
    if not points:
        return {"route_overhead_s": {}, "points": []}
    n = len(points)
    lone = Workload(np.arange(n, dtype=np.float64) * IDLE_GAP_S,
                    np.array([p["length_tokens"] for p in points], dtype=np.int64),
                    np.full(n, OUTPUT_TOKENS, dtype=np.int64), "idle points, one at a time")
    side, _ = simulate_side(topology, scenario, lone, layers, sharing=sharing)
    sim_ttft = [float(x) for x in side.ttft_s]
    for p, remote in zip(points, side.remote, strict=True):
        if (p["route"] == "prfaas") != bool(remote):
            raise ConfigError("idle_ttft", p, "the simulator routed this idle point elsewhere")
    return {"route_overhead_s": route_overheads(points, sim_ttft),
            "points": [{**p, "sim_ttft_s": round(t, 6)}
                       for p, t in zip(points, sim_ttft, strict=True)]}


def deployment_idle_points(url: str, model: str, profile: Path, max_context_tokens: int,
                           vocab_size: int) -> list[dict[str, Any]]:
    """The idle points on the deployment under test (already warmed), at the profile's
    prefill lengths: what `prfaas profile` measures on a deployment of its own, minutes
    earlier (experiments/idle_routes.py)."""
    from prfaas.experiments import idle_routes as idle

    usable = idle.usable_lengths([int(p["length_tokens"]) for p in
                                  read_profile_file(profile)["prefill"]["points"]],
                                 max_context_tokens)
    points = idle.measure_on(url, model, usable, vocab_size, idle.REPS, seed=11, warm=False)
    if not points:  # (a failed request leaves no point): no overheads would be a silent change
        raise PrfaasError(f"idle points: none of {len(usable) * idle.REPS} lone requests "
                          f"through {url} succeeded; see the deployment's logs")
    return points


def live_side(url: str, model: str, workload: Workload, vocab_size: int, seed: int
              ) -> tuple[Side, dict[str, Any]]:
    import asyncio

    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest

    rng = np.random.default_rng(seed)
    reqs = [BenchRequest([int(t) for t in rng.integers(3, vocab_size, int(n))], int(o))
            for n, o in zip(workload.input_tokens, workload.output_tokens, strict=True)]
    load0 = os.getloadavg()[0]
    results = asyncio.run(run_load(url, model, reqs, [float(a) for a in workload.arrival_s],
                                   timeout_s=900.0))
    nan = float("nan")
    arrival = np.array([r.sent_s for r in results])
    ttft = np.array([r.ttft_s if r.ok and r.ttft_s is not None else nan for r in results])
    finish = np.array([r.sent_s + r.e2e_s if r.ok and r.e2e_s is not None else nan
                       for r in results])
    remote = np.array([r.first_route == "prfaas" for r in results], dtype=bool)
    kv = [(int(workload.input_tokens[r.index]), int(r.prfaas.get("kv_bytes") or 0))
          for r in results if r.ok and r.prfaas.get("route") == "prfaas"]
    extra = {"errors": sum(1 for r in results if not r.ok),
             "error_samples": sorted({r.error[:160] for r in results if not r.ok})[:3],
             "retried": sum(1 for r in results if r.prfaas.get("first_route")
                            and r.prfaas.get("first_route") != r.prfaas.get("route")),
             "loadavg_1m_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
             "offloaded_kv": kv,
             "kv_bytes": [int(r.prfaas.get("kv_bytes") or 0) if r.ok else None
                          for r in results],
             # the router's own account of the request (diagnosis only, never compared):
             # its prefill call's duration and its overhead outside the workers
             "prefill_s": [_num(r.prfaas.get("prefill_s")) for r in results],
             "router_overhead_s": [_num(r.prfaas.get("router_overhead_s")) for r in results]}
    return Side(arrival, ttft, finish, remote), extra


WARMUP_HOW = ("before the first load, one request at a time (each after the previous one "
              "finished, then a pause) through the router: lengths at the length "
              "distribution's evenly spaced quantiles (so both routes), fresh random token-id "
              "prompts, the shortest output; not part of any figure")


def warmup_lengths(lengths: LengthDistribution, n: int) -> list[int]:
    """n prompt lengths at the distribution's quantiles k/(n+1): spread over its range, so the
    threshold policy sends some each way (each prefill instance, each KV link)."""
    return [lengths.quantile((k + 1) / (n + 1)) for k in range(n)]


def kv_check(offloaded: list[tuple[int, int]], profile: Path) -> dict[str, Any] | None:
    """The connector's counted bytes per offloaded request against the profile's S_kv(l)."""
    pairs = [(n, b) for n, b in offloaded if b > 0]
    if not pairs:
        return None
    kv = load_profile_file(profile).kv
    ratio = np.array([b / float(kv.size_bytes(n)) for n, b in pairs])
    return {"n": len(pairs), "live_over_profile_mean": round(float(ratio.mean()), 4),
            "min": round(float(ratio.min()), 4), "max": round(float(ratio.max()), 4)}


# -- the whole run ----------------------------------------------------------------------------

def served_model(url: str) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def free_ports(topology: Any) -> Any:
    return replace(topology, router_port=0, workers=tuple(
        replace(w, port=0, kv_port=0) for w in topology.workers))


def run(topology: Any, profile: Path, options: Options, out_dir: Path,
        tick: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.idle_routes import warm_up
    from prfaas.experiments.runs import deployed

    started = time.perf_counter()
    facts = model_facts(topology)
    t = threshold_of(topology)
    n = _roles(topology)
    raw = scenario_dict(topology, profile, options, facts.max_context_tokens)
    lengths = lengths_for(options, facts.max_context_tokens)
    sharing = core_sharing(topology, profile)
    capacity = planner_capacity_rps(lengths, profile, t, n["prfaas"], n["pd-p"],
                                    topology.link.rate_gbps or 100.0, sharing)
    unshared_capacity = planner_capacity_rps(lengths, profile, t, n["prfaas"], n["pd-p"],
                                             topology.link.rate_gbps or 100.0)
    loads = workloads(options, lengths, capacity)
    # the route overheads: from the profile's idle points now, or from the deployment's below
    # (both before any load: an idle point the simulator routes elsewhere stops the run early)
    idle = (None if options.idle_points_on_deployment
            else idle_overheads(topology, raw, profile, facts.num_layers, sharing))
    lives = []
    t0 = time.perf_counter()
    with deployed(free_ports(topology), out_dir / "logs") as dep:
        startup_s = time.perf_counter() - t0
        tick(f"deployment up in {startup_s:.0f} s")
        model = served_model(dep.url)
        with pinned_thread(topology.router_cores, "router.cores"):
            warm = warm_up(dep.url, model, warmup_lengths(lengths, options.warmup_requests),
                           options.output_range[0], facts.vocab_size, options.seed - 1)
        if warm:
            tick(f"warm-up: {len(warm)} requests, {sum(p['ok'] for p in warm)} ok, routes "
                 + "".join("R" if p["route"] == "prfaas" else "L" for p in warm))
        if options.idle_points_on_deployment:
            with pinned_thread(topology.router_cores, "router.cores"):
                idle_points = deployment_idle_points(dep.url, model, profile,
                                                     facts.max_context_tokens,
                                                     facts.vocab_size)
            idle = idle_overheads(topology, raw, profile, facts.num_layers, sharing,
                                  idle_points)
            tick(f"idle points on this deployment: {len(idle_points)}")
        for i, w in enumerate(loads):
            with pinned_thread(topology.router_cores, "router.cores"):  # the load generator
                lives.append(live_side(dep.url, model, w, facts.vocab_size,
                                       options.seed + 1 + i))
            tick(f"live load {w.offered_rps():.3f} req/s done")
            time.sleep(1.0)
    assert idle is not None
    overheads = idle["route_overhead_s"]
    sims = [simulate_side(topology, raw, w, facts.num_layers, overheads, sharing)
            for w in loads]
    # the same simulator without the measured overheads, and without the shared cores: what
    # each changes (reported only)
    bare = [simulate_side(topology, raw, w, facts.num_layers, None, sharing)[0]
            for w in loads] if overheads else [s for s, _ in sims]
    unshared = [simulate_side(topology, raw, w, facts.num_layers, overheads)[0]
                for w in loads] if sharing["sim_groups"] else [s for s, _ in sims]
    tick(f"simulated {len(loads)} loads (planner capacity {capacity:.3f} req/s at t={t})")
    entries = []
    for w, (live, extra), (sim, _), sim0, sim1 in zip(loads, lives, sims, bare, unshared,
                                                     strict=True):
        entry = load_entry(w.offered_rps(), live, sim)
        mape0, mape1 = ttft_mape(live, sim0), ttft_mape(live, sim1)
        entry["ttft_mape_without_route_overheads"] = None if mape0 is None else round(mape0, 4)
        entry["ttft_mape_without_core_sharing"] = None if mape1 is None else round(mape1, 4)
        entry.update(errors_live=extra["errors"], error_samples=extra["error_samples"],
                     retried_live=extra["retried"],
                     loadavg_1m_before_after=extra["loadavg_1m_before_after"],
                     kv_bytes_live_over_profile=kv_check(extra["offloaded_kv"], profile),
                     per_request={"input_tokens": [int(x) for x in w.input_tokens],
                                  "ttft_live_s": _round(live.ttft_s),
                                  "ttft_sim_s": _round(sim.ttft_s),
                                  "ttft_sim_without_route_overheads_s": _round(sim0.ttft_s),
                                  "ttft_sim_without_core_sharing_s": _round(sim1.ttft_s),
                                  "remote_live": live.remote.astype(int).tolist(),
                                  "remote_sim": sim.remote.astype(int).tolist(),
                                  "kv_bytes_live": extra["kv_bytes"],
                                  "prefill_live_router_s": extra["prefill_s"],
                                  "router_overhead_live_s": extra["router_overhead_s"],
                                  "prefill_profile_s": _profile_prefill(profile, w)})
        entries.append(entry)
    from prfaas.planner.search import plan_all
    from prfaas.scenario import parse_scenario

    plan = plan_all(parse_scenario(raw), mode="exact").systems["prfaas_pd"]
    return {
        "engine": facts.engine, "topology": topology.name,
        "profile": {"path": str(profile), **read_profile_file(profile)},
        "policy": topology.policy, "threshold_tokens": t,
        "instances": n, "link_gbps": topology.link.rate_gbps,
        # where the router and this load generator ran (None: wherever the kernel put them)
        "router_cores": topology.router_cores,
        "link_sender_burst_bytes": _burst_bytes(topology),
        "planner_capacity_rps": round(capacity, 5),
        # the same without the shared cores' bound (each instance its own machine); the loads
        # are fractions of the figure above
        "planner_capacity_unshared_rps": round(unshared_capacity, 5),
        "route_overhead_s": overheads, "idle_points": idle["points"],
        "idle_points_source": ("deployment" if options.idle_points_on_deployment
                               else "profile"),
        "core_sharing": sharing,
        "plan_for_deployment_pool": {"threshold_tokens": plan.threshold_tokens,
                                     "n_p": plan.n_p, "n_d": plan.n_d,
                                     "lambda_max_rps": round(plan.lambda_max, 5)},
        "options": {**asdict(options), "load_fractions": list(options.load_fractions),
                    "output_range": list(options.output_range)},
        "workload": {"input_tokens_mean": round(float(loads[0].input_tokens.mean()), 1),
                     "input_tokens_p50": float(np.percentile(loads[0].input_tokens, 50)),
                     "input_tokens_max": int(loads[0].input_tokens.max()),
                     "lengths": lengths.name},
        "sim_config": sims[0][1], "live_startup_s": round(startup_s, 1),
        "warmup": {"how": WARMUP_HOW, "points": warm},
        "loads": entries, "goal": GOAL, "meets_goal": verdict(entries),
        "method": (__doc__ or "").strip(), "machine": {"cpus": os.cpu_count()},
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _num(value: Any) -> float | None:
    return round(float(value), 4) if isinstance(value, (int, float)) else None


def _profile_prefill(profile: Path, w: Workload) -> list[float]:
    pre = load_profile_file(profile).prefill
    assert pre is not None  # planner_capacity_rps checked it
    return [round(float(pre.seconds(int(n))), 4) for n in w.input_tokens]


def _burst_bytes(topology: Any) -> int | None:
    """The live sender's token-bucket burst (transport/shaper.py's default for the link's
    rate): KV up to this size leaves at once after the link idled; the simulator's link is a
    pure rate (sim/link.py)."""
    from prfaas.transport.shaper import TokenBucket

    rate = topology.link.sender_rate_gbps
    return None if rate is None else int(TokenBucket(rate).burst_bytes)


def _round(values: np.ndarray) -> list[float | None]:
    return [round(float(v), 4) if np.isfinite(v) else None for v in values]
