"""One sim-vs-live run end to end: start the deployment, warm it, measure its idle points,
calibrate the simulator on them, replay every load live, simulate the same loads, and assemble
`sim_vs_live.json` (the package docstring says what is compared)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.experiments.sim_vs_live import baseline
from prfaas.experiments.sim_vs_live import live as live_world
from prfaas.experiments.sim_vs_live.calibration import Calibration, calibrate
from prfaas.experiments.sim_vs_live.capacity import planner_capacity_rps
from prfaas.experiments.sim_vs_live.compare import Side, load_entry, mape, meets_goal, verdict
from prfaas.experiments.sim_vs_live.options import GOAL, LOADED_SHARE, MIN_REQUESTS, Options
from prfaas.experiments.sim_vs_live.options import time_limit_s as load_time_limit_s
from prfaas.experiments.sim_vs_live.scenario import (
    core_sharing,
    roles,
    scenario_dict,
    threshold_of,
)
from prfaas.experiments.sim_vs_live.simulated import simulate_side
from prfaas.experiments.sim_vs_live.workload import (
    WARMUP_HOW,
    lengths_for,
    warmup_lengths,
    workloads,
)
from prfaas.models.profile_file import load_profile_file, read_profile_file
from prfaas.serve.cores import pinned_thread
from prfaas.workload.requests import Workload


def host() -> dict[str, Any]:
    """What the live side ran on: the figures depend on it (docs name it beside them)."""
    name, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "AVX-512-BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags \
        else "AVX2" if "avx2" in flags else "other"
    return {"cpus": os.cpu_count(), "cpu": name, "isa": isa}


def _round(values: np.ndarray) -> list[float | None]:
    return [round(float(v), 4) if np.isfinite(v) else None for v in values]


def _profile_prefill(profile: Path, w: Workload) -> list[float]:
    pre = load_profile_file(profile).prefill
    assert pre is not None  # calibrate read it
    return [round(float(pre.seconds(int(n))), 4) for n in w.input_tokens]


def _kv_over(wire: list[int | None], remote: np.ndarray, lengths: np.ndarray,
             scenario: dict[str, Any]) -> dict[str, Any] | None:
    """The connector's counted bytes per offloaded request against the scenario's S_kv(l)."""
    from prfaas.scenario import parse_scenario

    kv = parse_scenario(scenario).kv
    ratio = np.array([b / float(kv.size_bytes(int(n))) for b, r, n in
                      zip(wire, remote, lengths, strict=True) if r and b])
    if not ratio.size:
        return None
    return {"n": int(ratio.size), "mean": round(float(ratio.mean()), 4),
            "min": round(float(ratio.min()), 4), "max": round(float(ratio.max()), 4)}


def _burst_bytes(topology: Any) -> int | None:
    """The live sender's token-bucket burst (transport/shaper.py's default for the link's
    rate): KV up to this size leaves at once after the link idled; the simulator's link is a
    pure rate (sim/link.py)."""
    from prfaas.transport.shaper import TokenBucket

    rate = topology.link.sender_rate_gbps
    return None if rate is None else int(TokenBucket(rate).burst_bytes)


def run(topology: Any, profile: Path, options: Options, out_dir: Path,
        tick: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The result document; a load that does not complete stops the loads, and the document
    then carries `incomplete` (the one line the CLI ends with) and the loads measured so far."""
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.idle_routes import warm_up
    from prfaas.experiments.runs import deployed
    from prfaas.models.profile_file import idle_ttft_points

    started = time.perf_counter()
    facts = model_facts(topology)
    ctx = facts.max_context_tokens
    t, n = threshold_of(topology), roles(topology)
    link_gbps = topology.link.rate_gbps or 100.0
    lengths = lengths_for(options, ctx)
    sharing = core_sharing(topology, profile)
    points = None if options.idle_points_on_deployment else idle_ttft_points(profile)
    lives: list[tuple[Side, dict[str, Any], float]] = []
    incomplete = None
    t0 = time.perf_counter()
    with deployed(live_world.free_ports(topology), out_dir / "logs") as dep:
        startup_s = time.perf_counter() - t0
        tick(f"deployment up in {startup_s:.0f} s")
        model = live_world.served_model(dep.url)
        with pinned_thread(topology.router_cores, "router.cores"):
            warm = warm_up(dep.url, model, warmup_lengths(lengths, options.warmup_requests),
                           options.output_range[0], facts.vocab_size, options.seed - 1)
        if warm:
            tick(f"warm-up: {len(warm)} requests, {sum(p['ok'] for p in warm)} ok, routes "
                 + "".join("R" if p["route"] == "prfaas" else "L" for p in warm))
        if points is None:
            with pinned_thread(topology.router_cores, "router.cores"):
                points = live_world.deployment_idle_points(dep.url, model, profile, ctx,
                                                           facts.vocab_size,
                                                           facts.block_size_tokens)
            tick(f"idle points on this deployment: {len(points)}")
        cal = calibrate(topology, profile, options, ctx, points, facts.num_layers, sharing)
        capacity = planner_capacity_rps(lengths, cal.scenario, t, n["prfaas"], n["pd-p"],
                                        link_gbps, sharing)
        tick(f"calibrated: prefill x {cal.service_scale}, overheads {cal.overhead_s} s, "
             f"planner capacity {capacity:.3f} req/s at t={t}")
        loads = workloads(options, lengths, capacity)
        for i, w in enumerate(loads):
            limit = load_time_limit_s(float(w.arrival_s[-1]), options)
            with pinned_thread(topology.router_cores, "router.cores"):  # the load generator
                side, extra = live_world.live_side(dep.url, model, w, facts.vocab_size,
                                                   options.seed + 1 + i, limit)
            lives.append((side, extra, limit))
            tick(f"live load {i + 1}/{len(loads)} ({options.load_fractions[i]:.2f} of "
                 f"capacity, {w.offered_rps():.3f} req/s) done, {extra['errors']} errors")
            incomplete = live_world.incomplete_line(i, len(loads), options.load_fractions[i],
                                                    w.offered_rps(), extra, w.input_tokens.size,
                                                    limit)
            if incomplete is not None:
                break
            time.sleep(1.0)
    loads = loads[:len(lives)]
    doc = _document(topology, profile, options, facts, lengths, sharing, points, cal, capacity,
                    loads, lives, tick)
    doc.update(live_startup_s=round(startup_s, 1), warmup={"how": WARMUP_HOW, "points": warm},
               wall_s=round(time.perf_counter() - started, 1))
    if incomplete is not None:
        doc["incomplete"] = incomplete
        doc["verdict"] = {**doc["verdict"], "predicts": False,
                          "line": f"incomplete: {incomplete}"}
    return doc


def _document(topology: Any, profile: Path, options: Options, facts: Any, lengths: Any,
              sharing: dict[str, Any], points: list[dict[str, Any]], cal: Calibration,
              capacity: float, loads: list[Workload],
              lives: list[tuple[Side, dict[str, Any], float]],
              tick: Callable[[str], None]) -> dict[str, Any]:
    """Simulate the loads (the calibrated simulator and, for comparison, without each of its
    calibrations) and put every figure in one document."""
    from prfaas.planner.search import plan_all
    from prfaas.scenario import parse_scenario

    ctx, layers = facts.max_context_tokens, facts.num_layers
    t, n = threshold_of(topology), roles(topology)
    link_gbps = topology.link.rate_gbps or 100.0
    plain = scenario_dict(topology, profile, options, ctx)
    unscaled = calibrate(topology, profile, options, ctx, points, layers, sharing, scale=False)
    ov = cal.overhead_s

    def sims(scenario: dict[str, Any], overheads: dict[str, float] | None,
             share: dict[str, Any] | None = sharing) -> list[Side]:
        return [simulate_side(topology, scenario, w, layers, overheads, share)[0]
                for w in loads]

    main = [simulate_side(topology, cal.scenario, w, layers, ov, sharing) for w in loads]
    variants = {"without_route_overheads": sims(cal.scenario, None),
                "without_service_scale": sims(unscaled.scenario, unscaled.overhead_s),
                "profile_only": sims(plain, None)}
    if sharing["sim_groups"]:
        variants["without_core_sharing"] = sims(cal.scenario, ov, None)
    tick(f"simulated {len(loads)} loads")
    entries = []
    for i, (w, (live, extra, limit), (sim, _)) in enumerate(zip(loads, lives, main,
                                                                strict=True)):
        base = baseline.predict(points, w.input_tokens, live.remote)
        entry = load_entry(w.offered_rps(), options.load_fractions[i], live, sim, base,
                           options.seed + i)
        for name, sides in variants.items():
            m = mape(live.ttft_s, sides[i].ttft_s)
            entry[f"ttft_mape_{name}"] = None if m is None else round(m, 4)
        entry.update(time_limit_s=round(limit, 1), errors_live=extra["errors"],
                     timed_out_live=extra["timed_out"], error_samples=extra["error_samples"],
                     retried_live=extra["retried"],
                     loadavg_1m_before_after=extra["loadavg_1m_before_after"],
                     kv_bytes_live_over_sim=_kv_over(extra["kv_wire_bytes"], live.remote,
                                                     w.input_tokens, cal.scenario),
                     kv_bytes_live_over_profile=_kv_over(extra["kv_wire_bytes"], live.remote,
                                                         w.input_tokens, plain),
                     per_request={"input_tokens": [int(x) for x in w.input_tokens],
                                  "arrival_s": _round(w.arrival_s),
                                  "ttft_live_s": _round(live.ttft_s),
                                  "ttft_sim_s": _round(sim.ttft_s),
                                  "ttft_baseline_s": _round(base),
                                  **{f"ttft_sim_{k}_s": _round(v[i].ttft_s)
                                     for k, v in variants.items()},
                                  "e2e_live_s": _round(live.e2e_s),
                                  "e2e_sim_s": _round(sim.e2e_s),
                                  "remote_live": live.remote.astype(int).tolist(),
                                  "remote_sim": sim.remote.astype(int).tolist(),
                                  "kv_bytes_live": extra["kv_bytes"],
                                  "kv_wire_bytes_live": extra["kv_wire_bytes"],
                                  "prefill_live_router_s": extra["prefill_s"],
                                  "router_overhead_live_s": extra["router_overhead_s"],
                                  "prefill_profile_s": _profile_prefill(profile, w)})
        entries.append(entry)
    plan = plan_all(parse_scenario(cal.scenario), mode="exact").systems["prfaas_pd"]
    return {
        "engine": facts.engine, "topology": topology.name, "host": host(),
        "profile": {"path": str(profile), **read_profile_file(profile)},
        "policy": topology.policy, "threshold_tokens": t,
        "instances": n, "link_gbps": topology.link.rate_gbps,
        # where the router and this load generator ran (None: wherever the kernel put them)
        "router_cores": topology.router_cores,
        "link_sender_burst_bytes": _burst_bytes(topology),
        # the loads are fractions of this: the planner on the calibrated system
        "planner_capacity_rps": round(capacity, 5),
        # the same on the profile alone, and without the shared cores' bound
        "planner_capacity_profile_rps": round(planner_capacity_rps(
            lengths, plain, t, n["prfaas"], n["pd-p"], link_gbps, sharing), 5),
        "planner_capacity_unshared_rps": round(planner_capacity_rps(
            lengths, cal.scenario, t, n["prfaas"], n["pd-p"], link_gbps), 5),
        "calibration": cal.describe(),
        "route_overhead_s": ov, "service_scale": cal.service_scale,
        "without_service_scale": {"route_overhead_s": unscaled.overhead_s},
        "idle_points": [{**p, "sim_ttft_s": round(s, 6)}
                        for p, s in zip(points, cal.sim_idle_ttft_s, strict=True)],
        "idle_points_source": "deployment" if options.idle_points_on_deployment else "profile",
        "core_sharing": sharing,
        "scenario": cal.scenario,
        "plan_for_deployment_pool": {"threshold_tokens": plan.threshold_tokens,
                                     "n_p": plan.n_p, "n_d": plan.n_d,
                                     "lambda_max_rps": round(plan.lambda_max, 5)},
        "options": {**asdict(options), "load_fractions": list(options.load_fractions),
                    "output_range": list(options.output_range)},
        "workload": {"input_tokens_mean": round(float(loads[0].input_tokens.mean()), 1)
                     if loads else None, "lengths": lengths.name},
        "sim_config": main[0][1] if main else None,
        "loads": entries, "min_requests": MIN_REQUESTS, "loaded_share": LOADED_SHARE,
        "verdict": verdict(entries), "goal": GOAL, "meets_goal": meets_goal(entries),
        "method": _method(),
    }


def _method() -> str:
    import prfaas.experiments.sim_vs_live as package

    return (package.__doc__ or "").strip()
