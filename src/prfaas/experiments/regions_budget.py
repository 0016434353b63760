"""A destination's egress budget, live and metered (two regions, emulated hardware).

The gateway holds a destination's prefills back before they start, by the simulator's rule
(policy/region_control.py: the Eq. 1 KV rate of its running prefills plus the highest one a
prefill emits must fit its budget). Whether the bytes then delivered respect the budget is read
at the link, not assumed: during the run a sampler reads each region's link counter on the host
end of its veth (`NetnsLink.carried_bytes`: what left the PrfaaS namespace through that link,
KV plus TCP/IP headers and the gateway's small replies) every `SAMPLE_S` live seconds, and the
gateway meters the namespace end of the same veth (serve/link_meter.py). Per destination the run
reports the bytes its link carried, its rate in windows of `window_s` scenario seconds against
its budget, and the picks at which the budget held it back (`budget_held`); beside it the
simulator on the same requests: its `budget_held` and its link's bytes in the same windows
(sim/regions.py `link_points`; the simulated flow joins the link when the prefill starts and
runs at the link's rate, so a simulated window holds a prefill's KV where the live link spreads
it over the compute). The control: the same plan and requests with no budget (the link's rate).
All rates in scenario Gbps (live bytes / scales.bytes over live seconds / scales.time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from prfaas.experiments.regions_live import (
    RegionsSetup,
    gateway_status,
    run_live,
    run_stats,
)
from prfaas.serve.deploy.regions import RegionsDeployment
from prfaas.sim.regions import RegionsSimulator
from prfaas.sim.regions_run import build_regions

SAMPLE_S = 0.25  # live seconds between two reads of the links' counters


@contextmanager
def link_samples(dep: RegionsDeployment) -> Iterator[dict[str, list[tuple[float, int]]]]:
    """Per region (monotonic live seconds, bytes carried) read every SAMPLE_S in a thread
    while the block runs, once more at its end."""
    series: dict[str, list[tuple[float, int]]] = {n: [] for n in dep.links}
    stop = threading.Event()

    def read() -> None:
        now = time.monotonic()
        for name, link in dep.links.items():
            series[name].append((now, link.carried_bytes()))

    def loop() -> None:
        while not stop.wait(SAMPLE_S):
            read()

    read()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield series
    finally:
        stop.set()
        thread.join()
        read()


def window_gbps(points: list[tuple[float, float]], start_s: float, end_s: float,
                window_s: float) -> list[float]:
    """Mean rate (Gbps) in consecutive windows of `window_s` from `start_s` to `end_s`, from
    (time, cumulative bytes) points, interpolated linearly between them."""
    if len(points) < 2 or end_s - start_s < window_s:
        return []
    t, b = np.asarray(points, dtype=float).T
    edges = start_s + window_s * np.arange(int((end_s - start_s) // window_s) + 1)
    return [round(float(x), 4) for x in np.diff(np.interp(edges, t, b)) * 8 / 1e9 / window_s]


def without_budgets(setup: RegionsSetup) -> RegionsSetup:
    """The control: the same plan (t, split, rates) and requests, every destination's budget
    its link's usable rate, in the gateway and in the simulator."""
    s = replace(setup.scenario, pd_clusters=tuple(
        replace(r, egress_budget_gbps=None) for r in setup.scenario.pd_clusters))
    rate = setup.scaled.scales.bytes / setup.scaled.scales.time
    usable = {r.name: r.usable_gbps * rate for r in s.pd_clusters}
    tenants = tuple(replace(t, budget_gbps=usable[t.name]) for t in setup.gateway.tenants)
    return replace(setup, scenario=s, gateway=replace(setup.gateway, tenants=tenants))


def _summary(rates: list[float], budget_gbps: float) -> dict[str, Any]:
    return {"windows": len(rates), "max_gbps": max(rates, default=None),
            "mean_gbps": round(float(np.mean(rates)), 4) if rates else None,
            "over_budget_windows": sum(r > budget_gbps for r in rates),
            "max_over_budget": round(max(rates) / budget_gbps, 4) if rates else None}


def budget_run(setup: RegionsSetup, dep: RegionsDeployment, *, load: float, duration_s: float,
               window_s: float, seed: int = 0,
               rates_rps: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Every region at `load` x its planned rate (or `rates_rps`, scenario req/s) for
    `duration_s` scenario seconds, live on `dep` and simulated on the same requests; per
    destination its budget, the picks it was held at, its link's bytes and rates in windows
    (module docstring). Scenario units."""
    a, b = setup.a, setup.scaled.scales.bytes
    rates = dict(rates_rps or {k: v * load for k, v in setup.planned_rps().items()})
    work = setup.workloads(rates, duration_s, seed)
    first = next(iter(rates))
    before = gateway_status(dep, first)
    t0 = time.monotonic()
    with link_samples(dep) as series:
        live = run_live(setup, dep, work, seed)
    time.sleep(2 * setup.gateway.meter_interval_s)  # the gateway's meter reads once more
    after = gateway_status(dep, first)
    span_s = float(max(w.arrival_s.max() for w in work.values()))  # live, last arrival
    cfg = build_regions(setup.scenario, setup.plan, setup.share_policy, controller=False)
    sim = RegionsSimulator(cfg, {k: setup.to_scenario_units(w) for k, w in work.items()}).run()
    sim_regions = {reg.setup.name: reg for reg in sim.regions}
    out: dict[str, Any] = {"load": load, "duration_s": duration_s, "window_s": window_s,
                           "rates_rps": rates, "regions": {}}
    for name, run in live.items():
        budget_live = next(t.budget_gbps for t in setup.gateway.tenants if t.name == name)
        budget = budget_live * a / b  # scenario Gbps
        # live link: (scenario s since the run's start, scenario bytes)
        pts = [((t - t0) / a, byte / b) for t, byte in series[name]]
        pts = [(t, byte - pts[0][1]) for t, byte in pts]
        live_rates = window_gbps(pts, 0.0, span_s / a, window_s)
        reg = sim_regions[name]
        sim_rates = window_gbps(reg.link_points, 0.0, span_s / a, window_s)
        g0, g1 = before["tenants"][name], after["tenants"][name]
        gw_link = g1.get("link", {})
        out["regions"][name] = {
            "budget_gbps": round(budget, 4),
            "live": {**run_stats(run, a),
                     "budget_held": g1["budget_held"] - g0["budget_held"],
                     "link_bytes_host_end": round(pts[-1][1]),
                     "link_bytes_gateway_meter": round((gw_link.get("link_bytes", 0)
                                                        - g0.get("link", {}).get(
                                                            "link_bytes", 0)) / b),
                     "kv_bytes_reported": round((g1["kv_bytes"] - g0["kv_bytes"]) / b),
                     "window_gbps": live_rates, **_summary(live_rates, budget)},
            "sim": {"budget_held": reg.held, "link_bytes": round(reg.link.bytes_sent),
                    "window_gbps": sim_rates, **_summary(sim_rates, budget),
                    "ttft_p90_s": _p90(reg.kv_at - reg.work.arrival_s),
                    "offload_fraction": round(float(reg.offloaded.mean()), 4)},
            "gateway_meter": gw_link}
    return out


def _p90(values: np.ndarray) -> float | None:
    ok = values[np.isfinite(values)]
    return round(float(np.percentile(ok, 90)), 4) if ok.size else None
