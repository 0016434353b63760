"""The simulated world: a workload through `Simulator` on the deployment's scenario, with the
live router's policy builder, the topology's shared cores and the routes' fixed overheads."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from prfaas.experiments.sim_vs_live.compare import Side
from prfaas.experiments.sim_vs_live.scenario import roles, threshold_of
from prfaas.workload.requests import Workload

IDLE_GAP_S = 1000.0  # between the idle points' lone requests in the simulator


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
    n = roles(topology)
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


def simulate_lone(topology: Any, scenario: dict[str, Any], lengths: list[int],
                  output_tokens: int, layers: int, sharing: dict[str, Any] | None = None
                  ) -> Side:
    """Each length as a lone request (IDLE_GAP_S apart: nothing queues), no overheads: what
    the simulator predicts for the idle points."""
    n = len(lengths)
    lone = Workload(np.arange(n, dtype=np.float64) * IDLE_GAP_S,
                    np.array(lengths, dtype=np.int64), np.full(n, output_tokens, dtype=np.int64),
                    "idle points, one at a time")
    side, _ = simulate_side(topology, scenario, lone, layers, sharing=sharing)
    return side
