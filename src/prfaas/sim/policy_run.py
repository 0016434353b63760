"""One simulation run with a named policy, prefix caches and a link schedule.

`run_policy` is what `prfaas simulate --policy/--cache-*/--link-schedule` and the policy
benchmark call: it builds the system from the scenario (planner optimum, then overrides), the
router from the policy registry (with the planner inputs a controlled router needs, and optional
TTFT-SLO admission), the prefix cache (`sim.caching`), runs a `Simulator` with the `CachePlugin`
and returns the summary with the cache keys (`prefix_hit_fraction`, `ideal_prefix_hit_fraction`,
`threshold_tokens` {mean, min, max}), `rejected`, the controller's t over time when present, and
with `rebalance` the role changes (sim/roles.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.core.files import read_structured
from prfaas.planner.search import PlanResult, inputs_from_scenario, plan_all
from prfaas.policy.base import make_router
from prfaas.policy.rebalancer import RebalancerConfig
from prfaas.scenario import Scenario
from prfaas.sim.caching import CachePlugin, SimPrefixCache, cache_metrics
from prfaas.sim.link import LinkSchedule
from prfaas.sim.metrics import summarize
from prfaas.sim.outages import Outage
from prfaas.sim.plugin import SimPlugin
from prfaas.sim.roles import RebalancePlugin, RoleMoves
from prfaas.sim.run import outage_plugin
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import SystemConfig, build_system
from prfaas.workload.requests import Workload


def parse_capacity(text: str | int | None) -> int | None:
    """'unlimited' (or None) -> None; otherwise a byte count (suffixes K/M/G/T: powers of 1024)."""
    if text is None or str(text).lower() == "unlimited":
        return None
    raw = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}.get(raw[-1:], 1)
    try:
        value = float(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        raise ConfigError("cache_capacity", text, "expected bytes (e.g. 80G) or unlimited") \
            from None
    if value < 0:
        raise ConfigError("cache_capacity", text, "must be >= 0")
    return int(value)


def load_link_schedule(path: str | Path) -> LinkSchedule:
    """A YAML/JSON list of [start_s, gbps] (or {start_s, gbps}) points, first at 0 s."""
    raw = read_structured(path, "link_schedule")
    if isinstance(raw, dict):
        raw = raw.get("schedule")
    if not isinstance(raw, list):
        raise ConfigError("link_schedule", str(path), "expected a list of [start_s, gbps]")
    points = []
    for i, item in enumerate(raw):
        if isinstance(item, dict):
            item = [item.get("start_s"), item.get("gbps")]
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ConfigError(f"link_schedule[{i}]", item, "expected [start_s, gbps]")
        points.append((float(item[0]), float(item[1])))
    return LinkSchedule.piecewise(points)


def build_cache(cfg: SystemConfig, workload: Workload, instances: list[tuple[str, str]],
                scope: str | None, capacity: int | None, snapshot_policy: str
                ) -> SimPrefixCache | None:
    if scope is None:
        return None
    longest = int(workload.input_tokens.max()) if len(workload) else None
    return SimPrefixCache(cfg.cache_kv or cfg.kv, scope, capacity, instances, snapshot_policy,
                          longest)


def run_policy(s: Scenario, system: str, policy: str | None, workload: Workload, *,
               threshold_tokens: int | None = None, cache_scope: str | None = None,
               cache_capacity: int | None = None, snapshot_policy: str = "every_block",
               link: LinkSchedule | None = None, ttft_slo_s: float | None = None,
               controller: dict[str, Any] | None = None, router_args: dict[str, Any] | None
               = None, rebalance: RebalancerConfig | None = None,
               planned: PlanResult | None = None, outages: Sequence[Outage] = (),
               plugins: Sequence[SimPlugin] = (), **overrides: Any
               ) -> tuple[Simulator, dict[str, Any]]:
    if link is not None:
        overrides["link"] = link
    planned = planned or plan_all(s, mode="exact")
    cfg = build_system(s, system, threshold_tokens=threshold_tokens, planned=planned,
                       **overrides)
    name = policy or cfg.router
    inputs = replace(inputs_from_scenario(s), n_prfaas=max(cfg.n_prfaas, 1))
    kwargs: dict[str, Any] = {"plan_inputs": inputs, **(router_args or {})}
    if controller is not None:
        kwargs["controller"] = controller
    t0 = cfg.threshold_tokens if cfg.threshold_tokens is not None else \
        inputs_threshold(s, system, planned)
    router = make_router(name, threshold_tokens=t0, ttft_slo_s=ttft_slo_s, **kwargs)
    cfg = replace(cfg, router=name)
    plugin = CachePlugin(None, workload)
    roles = RebalancePlugin(rebalance) if rebalance is not None else None
    downs = outage_plugin(outages, rebalance or next(
        (p for p in plugins if isinstance(p, RoleMoves)), None))
    extra = [p for p in (roles, downs) if p is not None]
    sim = Simulator(cfg, workload, router, plugins=[plugin, *extra, *plugins])
    plugin.cache = build_cache(cfg, workload, [(p.instance_id, p.cluster) for p in sim.prefills],
                               cache_scope, cache_capacity, snapshot_policy)
    sim.run()
    summary = summarize(sim)
    summary.update(cache_metrics(sim, plugin, workload))
    for extra_plugin in (*extra, *(p for p in plugins if isinstance(p, RoleMoves))):
        summary.update(extra_plugin.summary())
    summary["policy"] = router.name
    summary["config"] = {**cfg.describe(), "cache_capacity_bytes": cache_capacity,
                         "snapshot_policy": snapshot_policy, "ttft_slo_s": ttft_slo_s}
    summary["workload"] = workload.source
    history = getattr(getattr(router, "controller", None), "history", None)
    if history is None:
        history = getattr(getattr(getattr(router, "inner", None), "controller", None),
                          "history", None)
    if history is not None:
        summary["threshold_history"] = [[round(t, 3), v] for t, v in history]
    return sim, summary


def inputs_threshold(s: Scenario, system: str, planned: PlanResult | None = None) -> int:
    """A t for systems whose plan has none (a threshold policy run on them): the PrfaaS-PD
    optimum of the scenario (exact mode)."""
    t = (planned or plan_all(s, mode="exact")).systems["prfaas_pd"].threshold_tokens
    return int(t or 0)


def run_from_flags(s: Scenario, system: str, workload: Workload, *, policy: str | None,
                   cache_scope: str | None, cache_capacity: str | None,
                   link_schedule: str | None, snapshot_policy: str,
                   ttft_slo_s: float | None, threshold: int | None, n_p: int | None,
                   n_d: int | None, link_gbps: float | None, no_pipeline: bool,
                   prefill_order: str, rebalance: RebalancerConfig | None = None,
                   planned: PlanResult | None = None, outages: Sequence[Outage] = (),
                   max_queued_per_prefill: int | None = None,
                   plugins: Sequence[SimPlugin] = ()) -> tuple[Simulator, dict[str, Any]]:
    """`prfaas simulate` with the policy/cache/link-schedule flags; adds `sim_wall_s`."""
    import time

    overrides: dict[str, Any] = {"prefill_order": prefill_order, "n_p": n_p, "n_d": n_d}
    if no_pipeline:
        overrides["pipelined"] = False
    if max_queued_per_prefill is not None:
        overrides["max_queued_per_prefill"] = max_queued_per_prefill
    link = load_link_schedule(link_schedule) if link_schedule else (
        LinkSchedule.constant(link_gbps) if link_gbps is not None else None)
    if cache_scope is None and cache_capacity is not None:
        cache_scope = "cluster"  # a capacity alone means the paper's per-cluster pools
    started = time.perf_counter()
    sim, summary = run_policy(s, system, policy, workload, threshold_tokens=threshold,
                              cache_scope=cache_scope,
                              cache_capacity=parse_capacity(cache_capacity),
                              snapshot_policy=snapshot_policy, link=link, ttft_slo_s=ttft_slo_s,
                              rebalance=rebalance, planned=planned, outages=outages,
                              plugins=plugins, **overrides)
    summary["sim_wall_s"] = round(time.perf_counter() - started, 4)
    return sim, summary
