"""The planner's capacity for the deployment, which the loads are fractions of: Eq. 6's prefill
terms at the topology's fixed t (exact mode) on the scenario's pools and S_kv(l), and where
prefill instances share cores, each shared core's own bound."""

from __future__ import annotations

from typing import Any

from prfaas.workload.lengths import LengthDistribution


def _curves(lengths: LengthDistribution, scenario: dict[str, Any], t: int) -> Any:
    import numpy as np

    from prfaas.core.errors import ConfigError
    from prfaas.planner.throughput import stage_curves
    from prfaas.scenario import parse_scenario

    s = parse_scenario(scenario)
    long, short = s.prfaas.hardware.prefill, s.pd.hardware.prefill
    if long is None or short is None:
        raise ConfigError("profile", scenario["hardware"], "has no prefill points")
    return stage_curves(lengths, np.array([float(t)]), long, short, s.kv, "exact")


def planner_capacity_rps(lengths: LengthDistribution, scenario: dict[str, Any], t: int,
                         n_prf: int, n_p: int, link_gbps: float,
                         sharing: dict[str, Any] | None = None) -> float:
    """The planner's Λmax for this split at a fixed t, and where prefill instances share cores
    (`sharing`: scenario.core_sharing's groups), each shared core's own bound
    (`shared_core_capacity_rps`)."""
    from prfaas.planner.throughput import bounds

    curves = _curves(lengths, scenario, t)
    _, _, prf, pdp = bounds(curves, n_prf, n_p, link_gbps * 1e9 / 8)
    cap = float(min(prf[0], pdp[0]))
    shared = _shared_core_bound(curves, n_prf, n_p, sharing)
    return cap if shared is None else min(cap, shared)


def shared_core_capacity_rps(lengths: LengthDistribution, scenario: dict[str, Any], t: int,
                             n_prf: int, n_p: int, sharing: dict[str, Any] | None
                             ) -> float | None:
    """The request rate the most loaded shared core can carry: its members' prefill work per
    request (an instance of a pool gets 1/n of that pool's requests, at their mean T(l)) at
    most what k concurrent prefills get through there, k / slowdown(k, f) (sim/sharing.py's
    law; 1.0 for two on one core at f = 2). None: no instances share cores. Without it two
    instances pinned to one core count as two machines, and a "half load" can fill most of
    the core."""
    return _shared_core_bound(_curves(lengths, scenario, t), n_prf, n_p, sharing)


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
