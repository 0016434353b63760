"""The shape controller: re-solves the deployment's shape from the router's window and
proposes role changes of PD instances (PD-P <-> PD-D), with hysteresis and a price.

No clock, sockets or torch: time is `view.now_s`; the world (simulator or live router) feeds
`observe` as it routes, calls `tick(view)` and carries a proposed `ShapeChange` out (drain,
switch, rejoin), then reports how it ended with `finished`.

Inputs:
- the window: the last `window_requests` requests routed, none older than `window_s`: each
  one's uncached input length (input minus the longest prefix cached at any instance), output
  length, and which prefill instance reused how many cached tokens;
- the link: `view.link().capacity_gbps` (measured), of which `link_headroom` is planned on;
- the queues: each PD instance's queued work or running sequences (how long it takes to drain).

Solve (every `period_s`): for each split n_p + n_d = N of the PD instances up, each role keeping
`min_per_role`, the planner's best throughput Λ(n_p) over t (planner.search.split_optimum:
Eqs 3-7 on the window's empirical lengths and mean output, the link, the PrfaaS instances up).
The direction is toward the best split when it beats the current one by more than `min_gain`
on the whole window and on each of its halves (the window's sampling noise alone does not move
roles: a heavy-tailed window of a few hundred requests misjudges Λ by several percent, and two
independent halves rarely err the same way) and one step that way gains; the proposal moves
one instance that step, with the t the planner pairs with the new split (the PrfaaS share is
P(L > t)).

Hysteresis: the direction must hold through every solve for `persist_s`; `cooldown_s` must have
passed since the last change ended; a move opposite to the last completed one within `hold_s`
of it is a flap and is refused. One change at a time.

Price: a move is made only if its gain over `payback_s` exceeds its cost, both in requests:
  gain = (Λ(one step) - Λ(now)) x payback_s
  cost = (Λ(now) - Λ(without the instance)) x (drain_s + switch_s) + cache_lost_s / T_pd-p
where drain_s is the instance's queued work (prefill) or L_out steps (a decoder with running
sequences), cache_lost_s the prefill seconds its prefix cache saved over the window (each prefix
it served is computed once more elsewhere), T_pd-p the PD-P per-request prefill time at t.
Of the instances in the source role the cheapest moves (among equals the quickest to drain,
then the least loaded).

Refusals (`Refusal`, kind and reason): `empty_role` (a role would keep fewer than
`min_per_role`), `flap`, `busy` (a change is in progress), `unknown` (not an up PD instance),
`same_role`, `cost` (not worth it). An operator's change goes through `review`: the same checks
except persistence and price.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    ClusterView,
    InstanceLoad,
    Role,
    link_usable,
)
from prfaas.planner.search import PlanInputs, SplitOptimum, split_optimum, threshold_grid
from prfaas.planner.throughput import StageCurves, stage_curves
from prfaas.policy.base import Router
from prfaas.policy.controlled import ControlledRouter, Tunable
from prfaas.workload.lengths import empirical

REFUSALS = ("empty_role", "flap", "busy", "unknown", "same_role", "cost")
OTHER: dict[Role, Role] = {"prefill": "decode", "decode": "prefill"}


@dataclass(frozen=True, slots=True)
class ShapeConfig:
    period_s: float = 10.0
    window_requests: int = 1000
    window_s: float = 300.0  # older requests leave the window
    min_window: int = 100
    min_gain: float = 0.1  # the best split must beat the current one by this fraction
    persist_s: float = 20.0  # the same direction through every solve for this long
    cooldown_s: float = 30.0  # after a change ended
    hold_s: float = 120.0  # a move back within this long of the last one is a flap
    min_per_role: int = 1
    switch_s: float = 5.0  # restart and warm-up of a moved instance
    payback_s: float = 300.0  # the gain must repay the cost within this long
    link_headroom: float = 0.9
    mode: str = "exact"

    def __post_init__(self) -> None:
        for name in ("period_s", "window_s", "payback_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"shape.{name}", getattr(self, name), "must be positive")
        for name in ("min_gain", "persist_s", "cooldown_s", "hold_s", "switch_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"shape.{name}", getattr(self, name), "must be >= 0")
        if self.window_requests < 1 or not 1 <= self.min_window <= self.window_requests:
            raise ConfigError("shape.min_window", self.min_window,
                              f"must be in [1, window_requests={self.window_requests}]")
        if self.min_per_role < 1:
            raise ConfigError("shape.min_per_role", self.min_per_role, "must be >= 1")
        if not 0 < self.link_headroom <= 1:
            raise ConfigError("shape.link_headroom", self.link_headroom, "must be in (0, 1]")
        if self.mode not in ("exact", "paper"):
            raise ConfigError("shape.mode", self.mode, "must be exact or paper")

    @staticmethod
    def from_dict(raw: object, where: str = "shape") -> ShapeConfig:
        if raw is None:
            return ShapeConfig()
        if not isinstance(raw, dict):
            raise ConfigError(where, raw, "must be a mapping")
        unknown = sorted(set(raw) - set(ShapeConfig.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", raw[unknown[0]],
                              f"unknown; known: {', '.join(ShapeConfig.__dataclass_fields__)}")
        try:
            return ShapeConfig(**raw)
        except TypeError as exc:
            raise ConfigError(where, raw, str(exc)) from None


@dataclass(frozen=True, slots=True)
class ShapeChange:
    """One PD instance to move to `to_role`; `reason` says why, in numbers."""

    instance_id: str
    from_role: Role
    to_role: Role
    decided_s: float
    threshold_tokens: int  # t the planner pairs with the new split
    offload_fraction: float  # P(L > t): the PrfaaS share of the window's requests
    split_from: tuple[int, int]  # (n_p, n_d)
    split_to: tuple[int, int]
    lambda_from_rps: float  # the planner's throughput of each split on the window
    lambda_to_rps: float
    drain_s: float  # estimated, before the switch
    cache_lost_s: float
    gain_requests: float
    cost_requests: float
    reason: str
    requested: bool = False  # by an operator (`review`), not by the controller

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 4)
        out["split_from"], out["split_to"] = list(self.split_from), list(self.split_to)
        return out


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: str  # one of REFUSALS
    decided_s: float
    instance_id: str | None
    from_role: Role | None
    to_role: Role | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decided_s": round(self.decided_s, 4)}


@dataclass(frozen=True, slots=True)
class ShapeSolve:
    """One solve: the current split and the planner's optimum of every allowed split."""

    now_s: float
    n_prfaas: int
    current: SplitOptimum
    plans: tuple[SplitOptimum, ...]  # n_p = min_per_role .. N - min_per_role
    window: int
    output_tokens: int
    link_gbps: float

    @property
    def best(self) -> SplitOptimum:
        # ties: the split closest to the current one (no move for nothing)
        return max(self.plans, key=lambda p: (p.lambda_rps, -abs(p.n_p - self.current.n_p)))

    def to_json(self) -> dict[str, Any]:
        return {"now_s": round(self.now_s, 3), "n_prfaas": self.n_prfaas,
                "split": [self.current.n_p, self.current.n_d],
                "lambda_rps": round(self.current.lambda_rps, 4),
                "best_split": [self.best.n_p, self.best.n_d],
                "best_lambda_rps": round(self.best.lambda_rps, 4),
                "best_threshold_tokens": self.best.threshold_tokens,
                "window": self.window, "output_tokens": self.output_tokens,
                "link_gbps": round(self.link_gbps, 4)}


@dataclass(frozen=True, slots=True)
class _Seen:
    arrival_s: float
    uncached_tokens: int
    output_tokens: int
    reused_at: str | None  # the prefill instance whose cached prefix it reused
    saved_s: float  # PD-P prefill seconds that reuse saved


class ShapeController:
    """See the module docstring. `changes`, `refusals`, `outcomes` (counts by kind) and
    `last_solve` are what logs and metrics show."""

    def __init__(self, inputs: PlanInputs, config: ShapeConfig | None = None) -> None:
        self.inputs = inputs
        self.config = config or ShapeConfig()
        self._window: deque[_Seen] = deque(maxlen=self.config.window_requests)
        self._next_s: float | None = None
        self._want, self._want_since = 0, 0.0
        self._last: tuple[int, float, str] | None = None  # direction, ended_s, instance
        self._quiet_until = -np.inf  # cooldown
        self._refused: tuple[str, int] | None = None  # the refusal already reported
        self.busy: ShapeChange | None = None
        self.changes: list[ShapeChange] = []
        self.refusals: list[Refusal] = []
        self.outcomes: Counter[str] = Counter()
        self.last_solve: ShapeSolve | None = None
        self._solved: tuple[PlanInputs, StageCurves] | None = None  # of the last solve

    # -- what the world feeds --------------------------------------------------------------
    def observe(self, arrival_s: float, input_tokens: int, output_tokens: int,
                best_cached_tokens: int = 0, reused_at: str | None = None,
                reused_tokens: int = 0) -> None:
        """One routed request: its lengths, the longest prefix cached anywhere, and the prefix
        its prefill instance reused (`reused_at`, `reused_tokens`)."""
        uncached = max(int(input_tokens) - min(int(best_cached_tokens), int(input_tokens)), 1)
        saved = 0.0
        if reused_at is not None and reused_tokens > 0:
            pd = self.inputs.pd_prefill
            saved = pd.seconds(input_tokens) - pd.seconds(input_tokens, reused_tokens)
        self._window.append(_Seen(arrival_s, uncached, max(int(output_tokens), 1), reused_at,
                                  saved))

    def finished(self, instance_id: str, now_s: float, ok: bool, detail: str = "") -> None:
        """The change of `instance_id` ended: serving in its new role (`ok`), or back in its
        old one after a failure (`detail` says what failed)."""
        change = self.busy
        if change is None or change.instance_id != instance_id:
            raise ConfigError("shape.finished", instance_id,
                              f"no change of it in progress (busy: "
                              f"{change.instance_id if change else None})")
        self.busy = None
        self.outcomes["completed" if ok else "failed"] += 1
        if ok:
            self._last = (_direction(change.to_role), now_s, instance_id)
        self._quiet_until = now_s + self.config.cooldown_s
        self._want, self._refused = 0, None

    # -- decisions ----------------------------------------------------------------------------
    def tick(self, view: ClusterView) -> ShapeChange | Refusal | None:
        """Solve when due; a change to carry out, a refusal newly reached, or None."""
        now, cfg = view.now_s, self.config
        if self._next_s is None:
            self._next_s = now + cfg.period_s
        if now < self._next_s:
            return None
        self._next_s = now + cfg.period_s
        self._expire(now)
        if self.busy is not None or len(self._window) < cfg.min_window:
            return None
        solve = self.solve(view)
        if solve is None:
            return None
        direction = self._direction(solve, view)
        if direction != self._want:
            self._want, self._want_since, self._refused = direction, now, None
        if direction == 0 or now - self._want_since < cfg.persist_s or now < self._quiet_until:
            return None
        return self._move(solve, direction, view)

    def review(self, instance_id: str, to_role: Role, view: ClusterView
               ) -> ShapeChange | Refusal:
        """An operator's change: refused like the controller's own (busy, unknown, same role,
        empty role, flap), else accepted whatever the price, which the change still reports."""
        now = view.now_s
        inst = next((i for i in view.instances(PD_CLUSTER) if i.instance_id == instance_id),
                    None)
        if self.busy is not None:
            return self._refuse("busy", now, instance_id, None, to_role,
                                f"the change of {self.busy.instance_id} is in progress")
        if inst is None:
            return self._refuse("unknown", now, instance_id, None, to_role,
                                "not a PD instance that is up and routed to")
        if inst.role == to_role:
            return self._refuse("same_role", now, instance_id, inst.role, to_role,
                                f"already a {to_role} instance")
        refused = self._check(inst, _direction(to_role), view)
        if refused is not None:
            return refused
        self._expire(now)
        solve = self.solve(view) if len(self._window) >= self.config.min_window else None
        change = self._price(inst, _direction(to_role), solve, view, requested=True)
        return self._propose(change)

    def solve(self, view: ClusterView) -> ShapeSolve | None:
        """The planner on the window for every allowed split of the PD instances up."""
        solved = self._solve_on(list(self._window), view)
        if solved is None:
            return None
        solve, self._solved = solved  # the move is priced on it
        self.last_solve = solve
        return solve

    def _solve_on(self, seen: list[_Seen], view: ClusterView
                  ) -> tuple[ShapeSolve, tuple[PlanInputs, StageCurves]] | None:
        cfg = self.config
        n_p = len(view.instances(PD_CLUSTER, "prefill"))
        n_d = len(view.instances(PD_CLUSTER, "decode"))
        total = n_p + n_d
        if not seen or n_d < 1 or total < 2 * cfg.min_per_role:
            return None
        link = view.link()
        n_prf = len(view.instances(PRFAAS_CLUSTER, "prefill")) if link_usable(link) else 0
        gbps = max(link.capacity_gbps * cfg.link_headroom, 1e-9)
        out = round(float(np.mean([s.output_tokens for s in seen])))
        inputs = replace(self.inputs, lengths=empirical([s.uncached_tokens for s in seen],
                                                        "window"),
                         output_tokens=max(out, 1), link_gbps=gbps, n_prfaas=n_prf, n_pd=total)
        curves = stage_curves(inputs.lengths, threshold_grid(inputs.lengths,
                                                             inputs.t_step_tokens),
                              inputs.prfaas_prefill, inputs.pd_prefill, inputs.kv, cfg.mode)
        lo, hi = cfg.min_per_role, total - cfg.min_per_role
        plans = tuple(split_optimum(inputs, curves, n_prf, p, total - p)
                      for p in range(lo, hi + 1))
        current = split_optimum(inputs, curves, n_prf, n_p, n_d)
        return (ShapeSolve(view.now_s, n_prf, current, plans, len(seen), inputs.output_tokens,
                           gbps), (inputs, curves))

    def _direction(self, solve: ShapeSolve, view: ClusterView) -> int:
        """Toward the best split, when it beats the current one by more than `min_gain` on
        the whole window and on each of its halves (the older and the newer; a gain that only
        the window's sampling noise shows does not hold in two independent halves), and one
        step that way gains on the whole window."""
        direction = self._toward_best(solve)
        if direction == 0:
            return 0
        step = next(p for p in solve.plans if p.n_p == solve.current.n_p + direction)
        if not step.lambda_rps > solve.current.lambda_rps:
            return 0
        seen = list(self._window)
        half = len(seen) // 2
        for part in (seen[:half], seen[half:]):
            solved = self._solve_on(part, view)
            if solved is None or self._toward_best(solved[0]) != direction:
                return 0
        return direction

    def _toward_best(self, solve: ShapeSolve) -> int:
        best, cur = solve.best, solve.current
        if not best.lambda_rps > cur.lambda_rps * (1 + self.config.min_gain):
            return 0
        return int(np.sign(best.n_p - cur.n_p))

    # -- internals ------------------------------------------------------------------------------
    def _expire(self, now_s: float) -> None:
        horizon = now_s - self.config.window_s
        while self._window and self._window[0].arrival_s < horizon:
            self._window.popleft()

    def _move(self, solve: ShapeSolve, direction: int, view: ClusterView
              ) -> ShapeChange | Refusal | None:
        source: Role = "decode" if direction > 0 else "prefill"
        pool = list(view.instances(PD_CLUSTER, source))
        if not pool:
            return None
        # the cheapest; among equals the quickest to drain, then the least loaded (a decoder's
        # queued requests may still wait for their prefill: each one holds its drain up)
        priced = sorted(((self._price(i, direction, solve, view), i) for i in pool),
                        key=lambda ci: (ci[0].cost_requests, ci[0].drain_s,
                                        ci[1].queued_requests + ci[1].running,
                                        ci[1].instance_id))
        change, inst = priced[0]
        refused = self._check(inst, direction, view, quiet=True)
        if refused is None and change.gain_requests <= change.cost_requests:
            refused = self._refuse("cost", view.now_s, change.instance_id, source,
                                   change.to_role, f"{change.reason}: not worth it",
                                   quiet=True)
        if refused is not None:
            return refused if refused is not _QUIET else None
        return self._propose(change)

    def _check(self, inst: InstanceLoad, direction: int, view: ClusterView,
               quiet: bool = False) -> Refusal | None:
        """empty_role and flap (None: the move is allowed)."""
        now, cfg = view.now_s, self.config
        left = len(view.instances(PD_CLUSTER, inst.role)) - 1
        target = OTHER[inst.role]
        if left < cfg.min_per_role:
            return self._refuse("empty_role", now, inst.instance_id, inst.role, target,
                                f"would leave {left} {inst.role} instance(s); "
                                f"min_per_role is {cfg.min_per_role}", quiet)
        if self._last is not None and self._last[0] == -direction \
                and now - self._last[1] < cfg.hold_s:
            last_dir, ended, who = self._last
            return self._refuse("flap", now, inst.instance_id, inst.role, target,
                                f"would undo {who}'s move to {_role_of(last_dir)} "
                                f"{now - ended:.0f} s after it (hold_s {cfg.hold_s:.0f} s)",
                                quiet)
        return None

    def _price(self, inst: InstanceLoad, direction: int, solve: ShapeSolve | None,
               view: ClusterView, requested: bool = False) -> ShapeChange:
        cfg = self.config
        to_role = OTHER[inst.role]
        drain = self._drain_s(inst, solve)
        lost = sum(s.saved_s for s in self._window if s.reused_at == inst.instance_id)
        n_p = len(view.instances(PD_CLUSTER, "prefill"))
        n_d = len(view.instances(PD_CLUSTER, "decode"))
        step = (n_p + direction, n_d - direction)
        if solve is None:
            return ShapeChange(inst.instance_id, inst.role, to_role, view.now_s, 0, 0.0,
                               (n_p, n_d), step, 0.0, 0.0, drain, lost, 0.0, 0.0,
                               "requested (no window to price it yet)", requested)
        now_plan = solve.current
        to_plan = self._plan(solve, *step)
        out_plan = self._plan(solve, n_p - (inst.role == "prefill"), n_d - (inst.role == "decode"))
        per_request_s = self._pd_service_s(now_plan)
        gain = (to_plan.lambda_rps - now_plan.lambda_rps) * cfg.payback_s
        cost = max(now_plan.lambda_rps - out_plan.lambda_rps, 0.0) * (drain + cfg.switch_s) \
            + (lost / per_request_s if per_request_s > 0 else 0.0)
        best = solve.best
        why = (f"{'requested; ' if requested else ''}window of {solve.window} requests: split "
               f"{n_p}:{n_d} gives {now_plan.lambda_rps:.3g} req/s, {step[0]}:{step[1]} "
               f"{to_plan.lambda_rps:.3g} (best {best.n_p}:{best.n_d} "
               f"{best.lambda_rps:.3g}) at t={to_plan.threshold_tokens}; gain "
               f"{gain:.1f} req over {cfg.payback_s:.0f} s vs cost {cost:.1f} req (drain "
               f"{drain:.1f} s + switch {cfg.switch_s:.1f} s, cache {lost:.1f} s)")
        return ShapeChange(inst.instance_id, inst.role, to_role, view.now_s,
                           to_plan.threshold_tokens, to_plan.offload_fraction, (n_p, n_d), step,
                           now_plan.lambda_rps, to_plan.lambda_rps, drain, lost, gain, cost, why,
                           requested)

    def _plan(self, solve: ShapeSolve, n_p: int, n_d: int) -> SplitOptimum:
        for plan in solve.plans:
            if plan.n_p == n_p and plan.n_d == n_d:
                return plan
        assert self._solved is not None
        inputs, curves = self._solved
        return split_optimum(inputs, curves, solve.n_prfaas, max(n_p, 0), max(n_d, 0))

    def _pd_service_s(self, plan: SplitOptimum) -> float:
        """Mean PD-P prefill time of a request at the plan's t (what one lost second costs)."""
        assert self._solved is not None
        lengths = self._solved[0].lengths
        support = lengths.support
        short = support <= plan.threshold_tokens
        mass = float(lengths.pmf[short].sum())
        if mass <= 0:
            return 0.0
        times = self.inputs.pd_prefill.time_s(support[short])
        return float(np.dot(lengths.pmf[short], times) / mass)

    def _drain_s(self, inst: InstanceLoad, solve: ShapeSolve | None) -> float:
        if inst.role == "prefill":
            return inst.queued_work_s
        if not (inst.running or inst.queued_requests):
            return 0.0
        out = solve.output_tokens if solve is not None else self.inputs.output_tokens
        decode = self.inputs.decode
        return decode.step_at(max(inst.running, 1)) * out  # a sequence that has just joined

    def _refuse(self, kind: str, now_s: float, instance_id: str | None, from_role: Role | None,
                to_role: Role | None, reason: str, quiet: bool = False) -> Refusal:
        """Record a refusal; with `quiet` (the controller's own tick) one already reported
        for this direction is not repeated (returned as _QUIET)."""
        if quiet and self._refused == (kind, self._want):
            return _QUIET
        refusal = Refusal(kind, now_s, instance_id, from_role, to_role, reason)
        if quiet:
            self._refused = (kind, self._want)
        self.refusals.append(refusal)
        self.outcomes[f"refused_{kind}"] += 1
        return refusal

    def _propose(self, change: ShapeChange) -> ShapeChange:
        self.busy = change
        self.changes.append(change)
        self.outcomes["requested" if change.requested else "proposed"] += 1
        return change

    def to_json(self) -> dict[str, Any]:
        """What /shape shows: the change in progress, the last solve, every change and refusal
        (the most recent 50 of each) and the counts."""
        return {"busy": self.busy.to_json() if self.busy else None,
                "last_solve": self.last_solve.to_json() if self.last_solve else None,
                "changes": [c.to_json() for c in self.changes[-50:]],
                "refusals": [r.to_json() for r in self.refusals[-50:]],
                "outcomes": dict(self.outcomes), "config": asdict(self.config)}


_QUIET = Refusal("quiet", 0.0, None, None, None, "already reported")


def _direction(to_role: Role) -> int:
    """+1: one more prefill instance (a decoder moves); -1: one more decoder."""
    return 1 if to_role == "prefill" else -1


def _role_of(direction: int) -> Role:
    return "prefill" if direction > 0 else "decode"


def apply_threshold(router: Router, threshold_tokens: int, now_s: float) -> bool:
    """Put the t a change's new split goes with into force: a controlled router's threshold
    controller takes it (and re-solves from it on its own period), a router with a fixed t is
    set to it. False: the router has no t to set."""
    if isinstance(router, ControlledRouter):
        router.controller.set_threshold(now_s, threshold_tokens)
        return True
    if isinstance(router, Tunable):
        router.set_threshold_tokens(threshold_tokens)
        return True
    return False
