"""The shape controller in the simulator: the live router's `ShapeController` as events.

Every routed request is fed to the controller as the live router feeds it (its lengths, the
longest prefix cached anywhere, the prefix its prefill instance reused); every `period_s` the
plugin calls `tick` with an unlimited `SimView` of the pools. A `ShapeChange` is carried out as
sim/roles.py moves an instance (stop routing, drain, `switch_s`, rejoin under the same id);
when it serves in its new role the controller is told (`finished`) and the router gets the t
the planner paired with the new split (`policy.shape.apply_threshold`). Refusals are kept, as
the live router logs and counts them. JSON: `role_changes` (each with the controller's reason
and the drain it took) and `shape` (refusals and counts).
"""

from __future__ import annotations

from typing import Any

from prfaas.core.types import RouteDecision, RouteQuery
from prfaas.policy.shape import Refusal, ShapeChange, ShapeController, apply_threshold
from prfaas.sim.roles import RoleChangeRecord, RoleMoves
from prfaas.sim.simulator import Simulator


class ShapePlugin(RoleMoves):
    name = "shape"

    def __init__(self, controller: ShapeController) -> None:
        super().__init__(controller.config.switch_s)
        self.controller = controller
        self._changes: dict[str, ShapeChange] = {}

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        sim.call_at(self.controller.config.period_s, self._tick)

    def on_decided(self, req: int, query: RouteQuery, decision: RouteDecision) -> None:
        if decision.rejected:
            return
        info = query.request
        best = max(query.cached_tokens.values(), default=0)
        self.controller.observe(info.arrival_s, info.input_tokens, info.output_tokens, best,
                                decision.prefill_instance, decision.cached_tokens)

    def _tick(self) -> None:
        sim, view = self._sim, self._view
        assert sim is not None and view is not None
        got = self.controller.tick(view)
        if isinstance(got, ShapeChange):
            self._changes[got.instance_id] = got
            self._move(got.instance_id, got.from_role, got.to_role, None, got.reason)
        if sim.busy():
            sim.call_at(sim.now_s + self.controller.config.period_s, self._tick)

    def joined(self, record: RoleChangeRecord) -> None:
        sim = self._sim
        assert sim is not None
        change = self._changes.pop(record.instance)
        self.controller.finished(record.instance, sim.now_s, ok=True)
        apply_threshold(sim.router, change.threshold_tokens, sim.now_s)

    @property
    def refusals(self) -> list[Refusal]:
        return self.controller.refusals

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["shape"] = {"refusals": [r.to_json() for r in self.controller.refusals],
                        "outcomes": dict(self.controller.outcomes)}
        return out
