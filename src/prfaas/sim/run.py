"""One call from configuration and workload to metrics, with the simulator's own wall time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.policy.base import Router
from prfaas.policy.rebalancer import RebalancerConfig
from prfaas.sim.metrics import summarize
from prfaas.sim.outages import Outage, OutagePlugin
from prfaas.sim.plugin import SimPlugin
from prfaas.sim.roles import RebalancePlugin, RoleMoves
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import check_rate, make_arrivals
from prfaas.workload.lengths import LengthDistribution
from prfaas.workload.requests import Workload, synthetic
from prfaas.workload.traces import load_trace


def simulate(cfg: SystemConfig, workload: Workload, router: Router | None = None,
             candidate_limit: int | None = None, rebalance: RebalancerConfig | None = None,
             outages: Sequence[Outage] = (), plugins: Sequence[SimPlugin] = ()
             ) -> tuple[Simulator, dict[str, Any]]:
    """Run to completion; the summary gets `sim_wall_s` (the event loop only) and the resolved
    configuration under `config`. With `rebalance`, PD instances change roles (sim/roles.py)
    and the summary gets `role_changes` and `final_split`; with `outages`, instances or the
    link go down and up (sim/outages.py) and it gets `outages`, `lost`, `rerun_requests`;
    `plugins` join the run (e.g. sim/shape.py's ShapePlugin) and add their `summary()`."""
    roles = RebalancePlugin(rebalance) if rebalance is not None else None
    downs = outage_plugin(outages, rebalance or next(
        (p for p in plugins if isinstance(p, RoleMoves)), None))
    plugins = [p for p in (roles, downs, *plugins) if p is not None]
    started = time.perf_counter()
    sim = Simulator(cfg, workload, router, plugins=plugins,
                    candidate_limit=candidate_limit).run()
    wall_s = time.perf_counter() - started
    summary = summarize(sim)
    for plugin in plugins:
        if isinstance(plugin, RebalancePlugin | OutagePlugin | RoleMoves):
            summary.update(plugin.summary())
    summary["sim_wall_s"] = round(wall_s, 4)
    summary["config"] = cfg.describe()
    summary["workload"] = workload.source
    return sim, summary


def outage_plugin(outages: Sequence[Outage], moves: object | None) -> OutagePlugin | None:
    """`moves`: anything that moves instances between roles (--rebalance, --shape)."""
    if not outages:
        return None
    if moves is not None:
        raise ConfigError("outage", outages[0].as_text(),
                          "cannot be combined with --rebalance or --shape (an instance would "
                          "be moved and failed at once)")
    return OutagePlugin(list(outages))


def build_workload(lengths: LengthDistribution, output_tokens: int, *, rate_rps: float | None,
                   duration_s: float | None, requests: int | None, arrivals: str,
                   trace: str | None, seed: int) -> Workload:
    """The workload a `simulate` run replays: a trace (optionally rescaled to `rate_rps`, cut
    to `duration_s` or `requests`) or `requests` (or rate x duration) synthetic requests."""
    if rate_rps is not None:
        check_rate(rate_rps)
    if duration_s is not None and not duration_s > 0:
        raise ConfigError("duration", duration_s, "must be a positive number of seconds")
    if requests is not None and requests < 1:
        raise ConfigError("requests", requests, "must be at least 1")
    process = make_arrivals(arrivals)  # validates the name even when a trace is replayed
    if trace is not None:
        workload = load_trace(trace)
        if rate_rps is not None:
            workload = workload.rescaled(rate_rps)
        if duration_s is not None:
            workload = workload.until(duration_s)
        return workload.head(requests) if requests is not None else workload
    if rate_rps is None:
        raise ConfigError("rate", None, "a synthetic workload needs --rate")
    n = requests if requests is not None else max(round(rate_rps * (duration_s or 600.0)), 1)
    return synthetic(lengths, output_tokens, process, rate_rps, n, seed)
