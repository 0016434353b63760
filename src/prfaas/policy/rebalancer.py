"""Long-term role rebalancer (Eq. 8): move PD instances between prefill and decode roles.

Eq. 8 balances prefill capacity Θprfaas + Θpd-p against decode capacity Θpd-d. The caller
measures them (`StageRates`, requests/s; `stage_rates` computes them from the planner's model
for given lengths, t and counts) and calls `observe(now_s, rates, view)`. The ratio
r = (Θprfaas + Θpd-p) / Θpd-d is "prefill-bound" when r < 1 - tolerance and "decode-bound" when
r > 1 + tolerance. A `RoleChange` is returned only when:
- the same imbalance has lasted `persist_s` without interruption (a burst does not move roles),
  counting only while moving one instance would raise the bottleneck capacity
  min(Θprfaas + Θpd-p, Θpd-d) by at least `min_gain` (no flip-flop around the optimum, where
  one move only swaps which side is short);
- `cooldown_s` has passed since the last change (the previous move has taken effect);
- each PD role keeps at least `min_per_role` instances.
The instance moved is the cheapest to drain: for decode -> prefill the decoder with the fewest
running + queued sequences (drain estimate `decode_drain_s`, e.g. L_out x T_decode), for
prefill -> decode the PD-P instance with the least queued work. The caller applies the change as
an event after `drain_s` (the instance takes no new work meanwhile) and re-optimises t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, ClusterView, Role
from prfaas.planner.search import GBPS, PlanInputs
from prfaas.planner.throughput import bounds, decode_rate, stage_curves


@dataclass(frozen=True, slots=True)
class RebalancerConfig:
    persist_s: float = 60.0
    cooldown_s: float = 120.0
    tolerance: float = 0.15
    min_per_role: int = 1
    decode_drain_s: float = 30.0
    switch_s: float = 5.0  # fixed cost of a role change (reload, warm-up)
    min_gain: float = 0.02  # a move must raise min(prefill, decode capacity) by this fraction

    def __post_init__(self) -> None:
        for name in ("persist_s", "cooldown_s", "decode_drain_s", "switch_s", "min_gain"):
            if getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), "must be >= 0")
        if not 0 <= self.tolerance < 1:
            raise ConfigError("tolerance", self.tolerance, "must be in [0, 1)")
        if self.min_per_role < 1:
            raise ConfigError("min_per_role", self.min_per_role, "must be >= 1")


@dataclass(frozen=True, slots=True)
class StageRates:
    """Stage capacities (requests/s) and one PD instance's share in each PD role."""

    theta_prfaas_rps: float
    theta_pd_p_rps: float
    theta_pd_d_rps: float
    per_prefill_rps: float  # what one more PD-P instance adds
    per_decode_rps: float  # what one PD-D instance carries


@dataclass(frozen=True, slots=True)
class RoleChange:
    instance_id: str
    from_role: Role
    to_role: Role
    drain_s: float  # time before the instance serves in its new role
    decided_s: float
    ratio: float  # (Θprfaas + Θpd-p) / Θpd-d when decided
    reason: str


def stage_rates(inputs: PlanInputs, threshold_tokens: int, n_p: int, n_d: int,
                mode: str = "exact") -> StageRates:
    """The planner's Eqs 3-5 for these lengths, t and counts (per-instance shares included)."""
    ts = np.array([float(threshold_tokens)])
    curves = stage_curves(inputs.lengths, ts, inputs.prfaas_prefill, inputs.pd_prefill,
                          inputs.kv, mode)
    theta_prf, per_p, _, _ = bounds(curves, inputs.n_prfaas, 1, inputs.link_gbps * GBPS)
    step_s = inputs.decode.step_at(inputs.decode.bs_max)
    per_d = float(decode_rate(1, inputs.decode.bs_max, step_s, inputs.output_tokens))
    per_p_rps = float(per_p[0])
    return StageRates(float(theta_prf[0]), per_p_rps * n_p, per_d * n_d, per_p_rps, per_d)


class Rebalancer:
    def __init__(self, config: RebalancerConfig | None = None) -> None:
        self.config = config or RebalancerConfig()
        self._since_s: float | None = None
        self._direction = 0  # -1 prefill-bound, +1 decode-bound
        self._last_change_s = -math.inf
        self.changes: list[RoleChange] = []

    def observe(self, now_s: float, rates: StageRates, view: ClusterView) -> RoleChange | None:
        ratio = (rates.theta_prfaas_rps + rates.theta_pd_p_rps) / max(rates.theta_pd_d_rps,
                                                                      1e-12)
        tol = self.config.tolerance
        direction = -1 if ratio < 1 - tol else (1 if ratio > 1 + tol else 0)
        if direction and not self._improves(ratio, rates, direction):
            direction = 0  # imbalanced, but one move would overshoot: nothing to fix
        if direction != self._direction:
            self._direction, self._since_s = direction, now_s
        if direction == 0 or self._since_s is None:
            return None
        if now_s - self._since_s < self.config.persist_s:
            return None
        if now_s - self._last_change_s < self.config.cooldown_s:
            return None
        change = self._pick(now_s, ratio, direction, view)
        if change is not None:
            self._last_change_s = now_s
            self._since_s = now_s
            self.changes.append(change)
        return change

    def _improves(self, ratio: float, rates: StageRates, direction: int) -> bool:
        prefill_now = rates.theta_prfaas_rps + rates.theta_pd_p_rps
        prefill = prefill_now - direction * rates.per_prefill_rps
        decode = rates.theta_pd_d_rps + direction * rates.per_decode_rps
        if prefill <= 0 or decode <= 0:
            return False
        # the bottleneck stage's capacity must rise by min_gain: a move that merely trades one
        # bottleneck for an equal one (r = 0.83 <-> 1.22 in the case study) would flip-flop
        # on measurement noise
        now = min(prefill_now, rates.theta_pd_d_rps)
        return min(prefill, decode) > now * (1 + self.config.min_gain)

    def _pick(self, now_s: float, ratio: float, direction: int, view: ClusterView
              ) -> RoleChange | None:
        cfg = self.config
        source: Role = "decode" if direction < 0 else "prefill"
        pool = view.instances(PD_CLUSTER, source)
        if len(pool) <= cfg.min_per_role:
            return None
        if source == "decode":
            inst = min(pool, key=lambda i: (i.running + i.queued_requests, i.instance_id))
            drain = cfg.decode_drain_s if inst.running + inst.queued_requests else 0.0
            target: Role = "prefill"
            why = "prefill-bound"
        else:
            inst = min(pool, key=lambda i: (i.queued_work_s, i.instance_id))
            drain, target, why = inst.queued_work_s, "decode", "decode-bound"
        return RoleChange(inst.instance_id, source, target, drain + cfg.switch_s, now_s, ratio,
                          f"{why}: (Θprfaas+Θpd-p)/Θpd-d = {ratio:.2f} for "
                          f">= {cfg.persist_s:.0f} s")
