"""The topology's `plan:` section: what the deployment was planned for.

`prfaas plan` answers with a threshold, an offload fraction and a link rate; a deployment
built from that answer records the figures here, and the router exports them
(`prfaas_plan_offload_fraction`, `prfaas_link_planned_gbps`) so the alert rules in
deploy/prometheus/ compare what is live with what was planned: a link below its planned rate,
an offload share far from the plan. Both keys are optional; without `link_gbps` the planned
rate is the emulated link's `link.rate_gbps` (none on a real, unshaped link), and without
`offload_fraction` the offload alert has nothing to compare with and stays silent.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prfaas.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PlanSpec:
    offload_fraction: float | None = None  # share of requests prefilled on PrfaaS, in [0, 1]
    link_gbps: float | None = None  # the inter-DC rate the plan assumed

    def __post_init__(self) -> None:
        p = self.offload_fraction
        if p is not None and not 0 <= p <= 1:
            raise ConfigError("plan.offload_fraction", p, "must be in [0, 1]")
        if self.link_gbps is not None and not self.link_gbps > 0:
            raise ConfigError("plan.link_gbps", self.link_gbps, "must be > 0")

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


def parse_plan(raw: object) -> PlanSpec:
    """`plan:` from a topology mapping (None: nothing planned)."""
    if raw is None:
        return PlanSpec()
    if not isinstance(raw, dict):
        raise ConfigError("plan", raw, "must be a mapping")
    known = {f.name for f in fields(PlanSpec)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError("plan", key, f"unknown key; allowed: {', '.join(sorted(known))}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"plan.{key}", value, "must be a number or null")
        values[key] = None if value is None else float(value)
    return PlanSpec(**values)
