"""The deployment as a scenario the planner and the simulator read: the topology's instance
counts, link and policy threshold, the measured profile, and (once the idle points are in)
the deployment's own prefill times and counted KV bytes; and the prefill instances the
topology pins to shared cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.experiments.sim_vs_live.options import Options
from prfaas.models.profile_file import read_profile_file


def roles(topology: Any) -> dict[str, int]:
    out = {"prfaas": 0, "pd-p": 0, "pd-d": 0}
    for w in topology.workers:
        out[w.role] = out.get(w.role, 0) + 1
    if not (out["prfaas"] and out["pd-p"] and out["pd-d"]):
        raise ConfigError("workers", out, "sim-vs-live needs prfaas, pd-p and pd-d workers")
    return out


def threshold_of(topology: Any) -> int:
    t = topology.policy_args.get("threshold_tokens")
    if t is None:
        raise ConfigError("policy.threshold_tokens", None,
                          f"topology {topology.name!r}: sim-vs-live needs the policy's t")
    return int(t)


def max_input_tokens(options: Options, max_context_tokens: int) -> int:
    return min(options.max_tokens, max_context_tokens - options.output_range[1] - 1)


def _deployed_hardware(profile: Path, route: str, scale: float) -> dict[str, Any]:
    """The profile's hardware with its prefill points times `scale` (the deployment's own
    prefill time over the profile's, calibration.py)."""
    raw = read_profile_file(profile)
    hw: dict[str, Any] = {
        "gpus_per_instance": int(raw.get("gpus_per_instance", 1)),
        "prefill": {"points": [{"length_tokens": p["length_tokens"],
                                "time_s": float(p["time_s"]) * scale}
                               for p in raw["prefill"]["points"]],
                    "source": f"{profile.name} x {scale:.3f}: the {route} route's prefill "
                              f"time on the idle deployment over the profile's"}}
    if isinstance(raw.get("decode"), dict):
        d = raw["decode"]
        hw["decode"] = {k: d[k] for k in ("bs_max", "step_s", "step_points") if k in d}
    return hw


def scenario_dict(topology: Any, profile: Path, options: Options, max_context_tokens: int,
                  service_scale: dict[str, float] | None = None,
                  kv_points: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The deployment as a scenario (`prfaas plan --scenario` reads it): every pool on the
    measured profile (with `service_scale`, each route's prefill points scaled: "prfaas" the
    PrfaaS cluster, "pd" the PD cluster), S_kv(l) from the profile or fitted to `kv_points`
    ((length, bytes) the connector counted), the topology's instance counts and link (its
    transfers in the order the engine's workers send them, `EngineBackend.link_order`, each
    released to the link as they release it, `EngineBackend.kv_release`)."""
    from prfaas.serve.engines import engine_backend

    backend = engine_backend(topology)
    release = backend.kv_release()
    n = roles(topology)
    pd = n["pd-p"] + n["pd-d"]
    hi = max_input_tokens(options, max_context_tokens)
    if service_scale:
        hardware = {"prfaas-deployed": _deployed_hardware(profile, "prfaas",
                                                          service_scale.get("prfaas", 1.0)),
                    "pd-deployed": _deployed_hardware(profile, "pd",
                                                      service_scale.get("pd", 1.0))}
        prf_hw, pd_hw = "prfaas-deployed", "pd-deployed"
    else:
        hardware = {"measured": {"profile": str(profile)}}
        prf_hw = pd_hw = "measured"
    kv: dict[str, Any] = {"profile": str(profile)} if not kv_points else {
        "points": [{"length_tokens": int(n_tok), "bytes": int(b)} for n_tok, b in kv_points],
        "source": f"bytes the connector counted on {len(kv_points)} idle requests"}
    return {
        "name": f"{topology.name}-measured",
        "description": f"topology {topology.name} with the profile measured from its engine",
        "kv": kv,
        "hardware": hardware,
        "clusters": {"prfaas": {"hardware": prf_hw, "instances": n["prfaas"]},
                     "pd": {"hardware": pd_hw, "instances": pd}},
        "baselines": {"homogeneous_pd": {"hardware": pd_hw, "instances": n["prfaas"] + pd},
                      "naive_heterogeneous": {
                          "prefill": {"hardware": prf_hw, "instances": n["prfaas"]},
                          "decode": {"hardware": pd_hw, "instances": pd}}},
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
