"""A live topology from a scenario and a system: the planner's instance split as emulated
workers (`prfaas-i`, `pdp-i`, `pdd-i`), the scenario's link scaled (scales.py), the system's
router policy with t scaled to live tokens.

prfaas_pd: N_prfaas PrfaaS workers + N_p PD-P + N_d PD-D, `prfaas-threshold` at t' = t / tokens;
homogeneous_pd: N_p PD-P + N_d PD-D, `all-pd`; naive_heterogeneous: N_prfaas PrfaaS + N_d
PD-D, `all-prfaas`. The split and t are those `sim.system.build_system` takes (the planner's
exact-mode optimum), so the simulator of the scaled scenario runs the same system. Decode
workers get BS_max slots. The inter-DC link is the scaled rate: a kernel-shaped namespace
shared by all PrfaaS workers when this host can (`netns`, root), else each PrfaaS worker's own
token bucket at that rate (`token-bucket`: the same unless the link saturates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prfaas.emulated.backend import (
    ROLES_OF,
    EmulatedEngineBackend,
    check_system,
    emulated_config,
    hardware_for,
)
from prfaas.emulated.backend import control_slowdown as checked_slowdown
from prfaas.emulated.scales import ScaledScenario, Scales, scale_scenario
from prfaas.scenario import Scenario, load_scenario
from prfaas.serve.deploy.netns import netns_available
from prfaas.serve.topology import LinkSpec, Timeouts, Topology, WorkerSpec
from prfaas.sim.system import SystemConfig, build_system

POLICY_OF = {"prfaas_pd": "prfaas-threshold", "homogeneous_pd": "all-pd",
             "naive_heterogeneous": "all-prfaas"}
CONNECTIONS = 4


@dataclass(frozen=True)
class EmulatedSystem:
    """One system of a scenario, ready to run live and to simulate at the same scales."""

    topology: Topology
    scaled: ScaledScenario
    system: str
    sim_config: SystemConfig  # the scaled scenario's system, with the same split and t'


def emulated_system(scenario: str | Scenario, system: str, scales: Scales | None = None, *,
                    link_emulation: str = "auto", policy: str | None = None,
                    policy_args: dict[str, Any] | None = None, n_p: int | None = None,
                    n_d: int | None = None, control_slowdown: float = 1.0) -> EmulatedSystem:
    """`n_p` / `n_d` override the planner's PD split (the pool size stays);
    `control_slowdown` > 1 makes the workers (only) that much slower than the profile the
    router and `sim_config` use: a negative control (backend.py)."""
    check_system(system)
    original = load_scenario(scenario) if isinstance(scenario, str) else scenario
    sc = scales or Scales()
    scaled = scale_scenario(original, sc)
    plan = build_system(original, system, n_p=n_p, n_d=n_d)
    for role in ROLES_OF[system]:
        hardware_for(scaled, system, role)  # a role without its profile fails here, once
    bs_max = {"prfaas_pd": scaled.scenario.pd, "homogeneous_pd": scaled.scenario.homogeneous,
              "naive_heterogeneous": scaled.scenario.naive_decode}[system].hardware
    slots = bs_max.require_decode().bs_max
    engine = EmulatedEngineBackend.name
    workers = ([WorkerSpec(f"prfaas-{i}", "prfaas", engine=engine) for i in range(plan.n_prfaas)]
               + [WorkerSpec(f"pdp-{i}", "pd-p", engine=engine) for i in range(plan.n_p)]
               + [WorkerSpec(f"pdd-{i}", "pd-d", max_batch=slots, engine=engine)
                  for i in range(plan.n_d)])
    t_live = scaled.live_threshold(plan.threshold_tokens)
    emulation = ("netns" if netns_available() else "token-bucket") \
        if link_emulation == "auto" else link_emulation
    ref = scenario if isinstance(scenario, str) else original.path
    args = dict(policy_args or {})
    if t_live is not None:
        args.setdefault("threshold_tokens", t_live)
    topo = Topology(
        name=f"{original.name}/{system} (emulated)", workers=tuple(workers),
        model={"backend": "emulated", "scenario": ref, "system": system,
               "scales": sc.to_json(),
               **({"control_slowdown": control_slowdown} if control_slowdown != 1.0 else {})},
        policy=policy or POLICY_OF[system], policy_args=args,
        link=LinkSpec(scaled.scenario.link_gbps, CONNECTIONS, emulation),
        intra_link=LinkSpec(None, 2), cache_capacity_bytes=0,
        timeouts=Timeouts(connect_s=10.0, prefill_s=600.0, kv_s=600.0, token_s=120.0),
        router_port=0)
    emulated_config(scaled)  # validates the context size
    checked_slowdown(topo.model)  # validates the control factor
    sim = build_system(scaled.scenario, system, threshold_tokens=t_live, n_p=plan.n_p,
                       n_d=plan.n_d, kv_layers=scaled.layout.num_layers)
    return EmulatedSystem(topo, scaled, system, sim)
