"""Role changes in the simulator: how a PD instance moves (`RoleMoves`), and the policy's
`Rebalancer` (Eq. 8) driving it as events (`RebalancePlugin`; the shape controller's plugin is
sim/shape.py).

A move: the instance stops being routed to and drains: a prefill instance finishes what runs,
what is queued and what waits for a prefix move; a decoder finishes its batch, its waiting
sequences and the KV already on its way. `switch_s` after the drain ends it serves in the other
role under the same id. Every move is in `records` (`role_changes` in the run's JSON).

Every `period_s` the plugin measures stage capacities over the last `window_s` of the run:
- a prefill role (PrfaaS, PD-P): prefills finished / their service seconds (requests per busy
  second of one instance) x instances in the role; PrfaaS is also capped by the link's current
  capacity / mean KV bytes of the remote prefills finished (Eq. 3);
- decode: BS_max x sequences finished / slot-seconds (one decoder at full batch) x decoders.
A stage that finished nothing in the window gives no observation (no data, no move). The rates
go to `Rebalancer.observe` with an unlimited `SimView` of the PD pools; a `RoleChange` is
carried out as above.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, PRFAAS_CLUSTER
from prfaas.policy.rebalancer import Rebalancer, RebalancerConfig, RoleChange, StageRates
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.plugin import SimPlugin
from prfaas.sim.simulator import Simulator
from prfaas.sim.view import SimView

Instance = PrefillInstance | DecodeInstance


@dataclass
class RoleChangeRecord:
    time_s: float  # decided; the instance stops taking new work
    instance: str
    from_role: str
    to_role: str
    ratio: float | None  # (Θprfaas + Θpd-p) / Θpd-d measured when decided (the rebalancer)
    drained_s: float | None = None  # its last work finished
    ready_s: float | None = None  # serving in the new role (drained + switch_s)
    reason: str = ""  # the shape controller's, in numbers

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time_s": round(self.time_s, 3), "instance": self.instance,
                               "from_role": self.from_role, "to_role": self.to_role}
        if self.ratio is not None:
            out["ratio"] = round(self.ratio, 3)
        out.update(drained_s=_round(self.drained_s), ready_s=_round(self.ready_s))
        if self.reason:
            out["reason"] = self.reason
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class RoleMoves(SimPlugin):
    """The mechanics of a move (drain, switch, rejoin) and its records; a subclass decides."""

    name = "roles"

    def __init__(self, switch_s: float) -> None:
        self.switch_s = switch_s
        self.records: list[RoleChangeRecord] = []
        self._sim: Simulator | None = None
        self._view: SimView | None = None
        self._draining: dict[Instance, RoleChangeRecord] = {}
        self._pending = {"prefill": 0, "decode": 0}  # decided, not yet serving the new role

    def attach(self, sim: Simulator) -> None:
        if sim.cfg.pd_prefill is None:
            raise ConfigError(self.name, sim.cfg.system, "needs a system with PD prefill and "
                              "decode roles (prfaas_pd or homogeneous_pd)")
        self._sim, self._view = sim, sim.view.unlimited()

    def _move(self, instance_id: str, from_role: str, to_role: str, ratio: float | None,
              reason: str = "") -> RoleChangeRecord:
        sim = self._sim
        assert sim is not None
        inst: Instance = sim.prefill_by_id[instance_id] if from_role == "prefill" \
            else sim.decode_by_id[instance_id]
        record = RoleChangeRecord(sim.now_s, instance_id, from_role, to_role, ratio,
                                  reason=reason)
        self.records.append(record)
        self._pending[to_role] += 1
        sim.stop_routing(inst)
        self._draining[inst] = record
        self._check(inst)
        return record

    def _check(self, inst: Instance) -> None:
        sim = self._sim
        if sim is None or inst not in self._draining or not inst.idle():
            return
        record = self._draining.pop(inst)
        inst.end_s = record.drained_s = sim.now_s
        record.ready_s = sim.now_s + self.switch_s
        sim.call_at(record.ready_s, lambda: self._join(record))

    def _join(self, record: RoleChangeRecord) -> None:
        sim = self._sim
        assert sim is not None
        self._pending[record.to_role] -= 1
        if record.to_role == "prefill":
            sim.add_local_prefill(record.instance)
        else:
            sim.add_decoder(record.instance)
        self.joined(record)

    def joined(self, record: RoleChangeRecord) -> None:
        """`record`'s instance serves in its new role from now."""

    def on_prefill_done(self, req: int, prefill: PrefillInstance) -> None:
        if self._draining:
            self._check(prefill)

    def on_decode_done(self, decoder: DecodeInstance) -> None:
        if self._draining:
            self._check(decoder)

    def summary(self) -> dict[str, Any]:
        """JSON keys: the changes and the PD split at the end."""
        view = self._view
        assert view is not None
        return {"role_changes": [r.as_json() for r in self.records],
                "final_split": {"n_p": len(view.instances(PD_CLUSTER, "prefill")),
                                "n_d": len(view.instances(PD_CLUSTER, "decode"))}}


class RebalancePlugin(RoleMoves):
    name = "rebalance"

    def __init__(self, config: RebalancerConfig | None = None, period_s: float = 10.0,
                 window_s: float = 60.0) -> None:
        if not period_s > 0 or not window_s > 0:
            raise ConfigError("rebalance period_s/window_s", (period_s, window_s),
                              "must be positive seconds")
        self.rebalancer = Rebalancer(config)
        super().__init__(self.rebalancer.config.switch_s)
        self.period_s, self.window_s = period_s, window_s
        self._snaps: deque[tuple[float, tuple[float, ...]]] = deque()
        self._remote_kv_bytes = 0.0

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        self._snaps.append((0.0, self._counters()))
        sim.call_at(self.period_s, self._tick)

    # -- measurement --------------------------------------------------------------------------
    def _counters(self) -> tuple[float, ...]:
        sim = self._sim
        assert sim is not None
        now = sim.now_s
        return (sum(p.done for p in sim.remote), sum(p.served_s for p in sim.remote),
                sum(p.done for p in sim.local), sum(p.served_s for p in sim.local),
                sum(d.done for d in sim.decoders), sum(d.slot_s_at(now) for d in sim.decoders),
                self._remote_kv_bytes)

    def _rates(self, now_s: float) -> StageRates | None:
        sim, view = self._sim, self._view
        assert sim is not None and view is not None
        cur = self._counters()
        self._snaps.append((now_s, cur))
        while len(self._snaps) > 2 and self._snaps[1][0] <= now_s - self.window_s:
            self._snaps.popleft()
        d = [c - o for c, o in zip(cur, self._snaps[0][1], strict=True)]
        n_prf = len(view.instances(PRFAAS_CLUSTER, "prefill"))
        # an instance on its way to a role counts there: deciding as if it were missing
        # would order one move too many while a slow drain is still running
        n_p = len(view.instances(PD_CLUSTER, "prefill")) + self._pending["prefill"]
        n_d = len(view.instances(PD_CLUSTER, "decode")) + self._pending["decode"]
        if d[2] <= 0 or d[3] <= 0 or d[4] <= 0 or d[5] <= 0 or (n_prf and d[0] <= 0):
            return None
        theta_prf = 0.0
        if n_prf:
            link_rps = sim.link.capacity_gbps() * BYTES_PER_GBPS / (d[6] / d[0])
            theta_prf = min(n_prf * d[0] / d[1], link_rps)
        per_p = d[2] / d[3]
        per_d = sim.cfg.decode.bs_max * d[4] / d[5]
        return StageRates(theta_prf, per_p * n_p, per_d * n_d, per_p, per_d)

    # -- events -------------------------------------------------------------------------------
    def _tick(self) -> None:
        sim = self._sim
        assert sim is not None and self._view is not None
        rates = self._rates(sim.now_s)
        if rates is not None:
            change = self.rebalancer.observe(sim.now_s, rates, self._view)
            if change is not None:
                self._start(change)
        if sim.busy():
            sim.call_at(sim.now_s + self.period_s, self._tick)

    def _start(self, change: RoleChange) -> None:
        self._move(change.instance_id, change.from_role, change.to_role, change.ratio)

    # -- SimPlugin ------------------------------------------------------------------------------
    def on_prefill_done(self, req: int, prefill: PrefillInstance) -> None:
        if prefill.cluster == PRFAAS_CLUSTER and self._sim is not None:
            self._remote_kv_bytes += self._sim.log.kv_bytes[req]
        super().on_prefill_done(req, prefill)
