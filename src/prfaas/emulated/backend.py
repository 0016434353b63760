"""The emulated engine backend (`engine: emulated`, or `model: {backend: emulated}`): what a
topology's `model: {backend: emulated, scenario, system, scales}` builds.

Each worker process loads the scenario, scales it (scales.py) and takes the hardware its role
has in the named system: prfaas_pd: `prfaas` = the PrfaaS pool's, `pd-p` and `pd-d` = the PD
pool's; homogeneous_pd: the homogeneous pool's; naive_heterogeneous: `prfaas` = the naive
prefill pool's, `pd-d` = the naive decode pool's. A role whose hardware lacks the profile it
needs (prefill for prefill roles, decode for pd-d) is a ConfigError naming the hardware.

`control_slowdown` (optional, >= 1; a negative control, not a setting): the workers sleep that
factor longer than their profile, while the router's prior (`prefill_models`, `plan_inputs`)
and the simulator keep the profile; a capacity measured live must then fall below the
simulator's (experiments/live.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.emulated.scales import ScaledScenario, Scales, scale_scenario
from prfaas.models.card import ModelCard
from prfaas.models.engine_config import EngineConfig
from prfaas.models.kv import KVGeometry
from prfaas.models.profile import HardwareProfile, PrefillTime
from prfaas.planner.search import PlanInputs
from prfaas.scenario import load_scenario
from prfaas.serve.engines import EngineBackend

if TYPE_CHECKING:
    from prfaas.emulated.engine import EmulatedEngine

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
ROLES_OF = {"prfaas_pd": ("prfaas", "pd-p", "pd-d"), "homogeneous_pd": ("pd-p", "pd-d"),
            "naive_heterogeneous": ("prfaas", "pd-d")}
_KEYS = {"backend", "scenario", "system", "scales", "control_slowdown"}
BLOCK_ALIGN = 64


def check_system(system: str) -> str:
    if system not in SYSTEMS:
        raise UnknownNameError("system", system, list(SYSTEMS))
    return system


@lru_cache(maxsize=8)
def _scaled(scenario: str, scales: Scales) -> ScaledScenario:
    return scale_scenario(load_scenario(scenario), scales)


def scaled_from_model(model: dict[str, Any]) -> tuple[ScaledScenario, str]:
    unknown = sorted(set(model) - _KEYS)
    if unknown:
        raise ConfigError(f"model.{unknown[0]}", model[unknown[0]],
                          f"unknown key for the emulated backend; allowed: {sorted(_KEYS)}")
    if not isinstance(model.get("scenario"), str):
        raise ConfigError("model.scenario", model.get("scenario"), "must name a scenario")
    system = check_system(str(model.get("system", "prfaas_pd")))
    return _scaled(model["scenario"], Scales.from_json(model.get("scales"))), system


def control_slowdown(model: dict[str, Any]) -> float:
    """The model's `control_slowdown` (1.0 when absent): a number in [1, 10]."""
    raw = model.get("control_slowdown", 1.0)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 1.0 <= raw <= 10.0:
        raise ConfigError("model.control_slowdown", raw,
                          "a negative-control factor in [1, 10] (1: the profile's time)")
    return float(raw)


def hardware_for(scaled: ScaledScenario, system: str, role: str) -> HardwareProfile:
    s = scaled.scenario
    if role not in ROLES_OF[system]:
        raise ConfigError("role", role, f"{system} has no {role} workers")
    pools = {"prfaas_pd": {"prfaas": s.prfaas, "pd-p": s.pd, "pd-d": s.pd},
             "homogeneous_pd": {"pd-p": s.homogeneous, "pd-d": s.homogeneous},
             "naive_heterogeneous": {"prfaas": s.naive_prefill, "pd-d": s.naive_decode}}
    hw = pools[system][role].hardware
    if role == "pd-d":
        hw.require_decode()
    else:
        hw.require_prefill()
    return hw


def emulated_config(scaled: ScaledScenario) -> EngineConfig:
    """The EngineConfig the router and workers share: the layout's pattern, a context that
    holds the longest input plus the output, one block = the whole context (emulated workers
    keep no prefix cache: a synthetic workload has no shared prefixes)."""
    s = scaled.scenario
    need = s.lengths.hi + s.output_tokens + 1
    context = -(-need // BLOCK_ALIGN) * BLOCK_ALIGN
    return EngineConfig(layer_pattern=scaled.layout.pattern, block_size_tokens=context,
                        max_context_tokens=context, name=f"emulated-{scaled.original.name}")


def emulated_engine(model: dict[str, Any], role: str) -> EmulatedEngine:
    from prfaas.emulated.engine import EmulatedEngine  # torch: in the worker processes only

    scaled, system = scaled_from_model(model)
    hw = hardware_for(scaled, system, role)
    return EmulatedEngine(scaled.layout, emulated_config(scaled), hw.prefill, hw.decode,
                          slowdown=control_slowdown(model))


def emulated_plan_inputs(topology: Any) -> PlanInputs:
    """A controlled router's planner inputs for an emulated topology: the scaled scenario's
    profiles of the system's pools (not one profile for both, as for the CPU engine)."""
    scaled, system = scaled_from_model(topology.model)
    s = scaled.scenario
    roles = ROLES_OF[system]
    remote = hardware_for(scaled, system, "prfaas") if "prfaas" in roles else None
    local = hardware_for(scaled, system, "pd-p") if "pd-p" in roles else None
    prefill = (remote or local)
    assert prefill is not None
    n_pd = len(topology.by_role("pd-p")) + len(topology.by_role("pd-d"))
    return PlanInputs(
        lengths=s.lengths, output_tokens=s.output_tokens, kv=s.kv,
        t_step_tokens=s.t_step_tokens,
        prfaas_prefill=(remote or prefill).require_prefill(),
        pd_prefill=(local or prefill).require_prefill(),
        decode=hardware_for(scaled, system, "pd-d").require_decode(),
        n_prfaas=len(topology.by_role("prfaas")), n_pd=n_pd,
        link_gbps=topology.link.rate_gbps or s.link_gbps, intra_gbps=s.intra_gbps)


class EmulatedEngineBackend(EngineBackend):
    """Workers that sleep their hardware profile's time; the router predicts with the same
    profiles and plans with the scaled scenario (the simulator's inputs)."""

    name = "emulated"

    def card(self) -> ModelCard:
        scaled = scaled_from_model(self.topology.model)[0]
        config = emulated_config(scaled)
        kv = scaled.layout.kv_size()
        geo = KVGeometry(config.name, kv.per_token_bytes, kv.fixed_bytes, 0.0, 0, 0.0)
        return ModelCard(config.name, config.max_context_tokens, config.block_size_tokens, geo)

    def prefill_models(self) -> dict[str, PrefillTime]:
        """An emulated worker's prior is its role's hardware profile (what it sleeps, in live
        units), the one the simulator's router reads."""
        scaled, system = scaled_from_model(self.topology.model)
        return {w.name: hardware_for(scaled, system, w.role).require_prefill()
                for w in self.topology.workers if w.is_prefill}

    def plan_inputs(self) -> PlanInputs:
        return emulated_plan_inputs(self.topology)

    def codec_kv(self) -> str | None:
        return None  # synthetic KV bytes, no model's: nothing measured predicts their ratio

    def worker_engine(self, name: str) -> EmulatedEngine:
        return emulated_engine(self.topology.model, self.topology.worker(name).role)
