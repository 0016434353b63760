"""What the idle points tell the simulator, and nothing else does: three things per deployment,
each fitted on lone requests through the idle deployment before any load (never on a load).

1. Service time. A prefill instance inside the deployment is busy longer than the profile's
   standalone T(l): the connector's work runs inside the prefill (the native worker encodes
   each layer's arrays in the prefill thread while holding the engine, serve/worker/
   prefill_worker.py; vLLM's connector saves each attention layer in the forward), and the
   deployment's processes share the host. Each route's prefill points are scaled by the median,
   over that route's idle points, of the deployment's own prefill time (`prefill_s`: the
   worker's compute time, or the router's prefill call for vLLM) over the profile's T(l). A
   scaled service time occupies the instance, so under load it lengthens the queue behind it;
   a fixed overhead (3.) cannot.
2. S_kv(l): a linear fit to the bytes the connector counted on the wire for the idle points
   (`kv_wire_bytes`, else `kv_bytes`), not the profile's formula (which lacks, e.g., the
   native worker's linear-state snapshot and logits, or vLLM's block rounding).
3. Fixed overheads: per route, the median of (idle TTFT - the calibrated simulator's TTFT for
   the same lone request): the HTTP hops, the decoder's notice and first step, the stream
   back. They delay the first token and occupy nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.experiments.sim_vs_live.options import Options
from prfaas.experiments.sim_vs_live.scenario import scenario_dict
from prfaas.experiments.sim_vs_live.simulated import simulate_lone


@dataclass(frozen=True)
class Calibration:
    scenario: dict[str, Any]  # the deployment as the simulator sees it
    overhead_s: dict[str, float] = field(default_factory=dict)  # route -> fixed overhead
    service_scale: dict[str, float] = field(default_factory=dict)  # route -> prefill scale
    kv_points: list[tuple[int, int]] = field(default_factory=list)  # (length, counted bytes)
    sim_idle_ttft_s: list[float] = field(default_factory=list)  # per idle point, no overhead

    def describe(self) -> dict[str, Any]:
        kv = self.scenario["kv"]
        return {"route_overhead_s": self.overhead_s,
                "service_scale": {k: round(v, 4) for k, v in self.service_scale.items()},
                "kv": ({"source": "counted by the connector", "points": len(self.kv_points)}
                       if self.kv_points else {"source": f"profile {kv.get('profile')}"})}


def service_scales(points: list[dict[str, Any]], profile: Path) -> dict[str, float]:
    """Per route: median over its idle points of their `prefill_s` over the profile's T(l);
    a route whose points carry no `prefill_s` is left out (the profile's time stands)."""
    from prfaas.models.profile_file import load_profile_file

    pre = load_profile_file(profile).prefill
    assert pre is not None  # a profile without prefill points is refused when loaded
    out: dict[str, float] = {}
    for route in sorted({str(p["route"]) for p in points}):
        ratios = [float(p["prefill_s"]) / float(pre.seconds(int(p["length_tokens"])))
                  for p in points if p["route"] == route and p.get("prefill_s")]
        if ratios:
            out[route] = float(np.median(ratios))
    return out


def counted_kv_points(points: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(length, bytes the connector counted on the wire) of every idle point that reports
    them; empty unless at least two lengths do (a line needs two)."""
    out = []
    for p in points:
        counted = p.get("kv_wire_bytes") or p.get("kv_bytes")
        if counted:
            out.append((int(p["length_tokens"]), int(counted)))
    return out if len({n for n, _ in out}) >= 2 else []


def calibrate(topology: Any, profile: Path, options: Options, max_context_tokens: int,
              points: list[dict[str, Any]], layers: int, sharing: dict[str, Any] | None,
              scale: bool = True, counted_kv: bool = True) -> Calibration:
    """The calibrated scenario and overheads from the idle `points` (module docstring);
    `scale` / `counted_kv` False leave the profile's prefill times / S_kv(l) as they are (the
    simulator before those refinements, for comparison). No points: the profile alone."""
    from prfaas.experiments.idle_routes import OUTPUT_TOKENS, route_overheads

    scales = service_scales(points, profile) if scale and points else {}
    kv_points = counted_kv_points(points) if counted_kv else []
    scenario = scenario_dict(topology, profile, options, max_context_tokens, scales, kv_points)
    if not points:
        return Calibration(scenario, {}, scales, kv_points, [])
    side = simulate_lone(topology, scenario, [int(p["length_tokens"]) for p in points],
                         OUTPUT_TOKENS, layers, sharing)
    for p, remote in zip(points, side.remote, strict=True):
        if (p["route"] == "prfaas") != bool(remote):
            raise ConfigError("idle_ttft", p, "the simulator routed this idle point elsewhere")
    sim_ttft = [float(x) for x in side.ttft_s]
    return Calibration(scenario, route_overheads(points, sim_ttft), scales, kv_points,
                       sim_ttft)
