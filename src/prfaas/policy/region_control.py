"""Per-destination controls of a PrfaaS cluster serving several PD clusters.

- `EgressBudget`: a destination may start another PrfaaS prefill only while the KV rate of its
  running prefills (each emits about S_kv(l) / T_prefill(l) bytes/s, Eq. 1) stays within its
  budget (Gbps, at most its link's rate). A prefill whose KV rate alone exceeds the budget may
  start when none of that destination runs, so nothing waits forever. The budget keeps one
  destination's KV from being produced faster than its own link drains it (that compute is
  better spent on another tenant) and is what `fair_share.pick(blocked=...)` receives.
- `DestinationThreshold`: one per destination, a short-timescale threshold controller on the
  two queues a request of that destination can join: its PrfaaS backlog (its queued prefill
  seconds over its planned share of instances) and its PD-P backlog (queued seconds over N_p).
  While the PrfaaS wait exceeds `limit_s` and `ratio` x the PD-P wait, t rises by `step` (fewer
  offloads); while the PD-P wait exceeds `limit_s` and `ratio` x the PrfaaS wait, t falls by
  `step` (more offloads, down to `min_tokens`); when both waits are back under `limit_s / 4`, t
  steps back toward the planned t. Given the caller's time (`now_s`), t moves at most once per
  `hold_s` (default `limit_s`); stepping on every arrival ran t from 25,000 to its bounds in
  seconds and made two-regions diverge at 99% of its plan (docs/multi-region.md). It is for
  sustained imbalance (a region over its plan, a side lost), not for the queues' noise at the
  plan's edge: there both sides are critical (Eq. 7), waits of 10-40 s come and go, and moving t
  only hurts: with `limit_s` 20 s the simulated capacity of the case study fell up to 4.6%
  below its plan in a manual run; with these defaults it is within 1% (docs/multi-region.md),
  and a region at 3x its plan still moves t.

Both read only their arguments (no clock): the simulator calls them and a live scheduler can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.models.profile import KVSize, PrefillTime


@dataclass(frozen=True)
class EgressBudget:
    budget_gbps: float

    def __post_init__(self) -> None:
        if not self.budget_gbps > 0:
            raise ConfigError("egress_budget_gbps", self.budget_gbps, "must be positive")

    def admits(self, running_gbps: float, job_gbps: float, running_jobs: int) -> bool:
        return running_jobs == 0 or running_gbps + job_gbps <= self.budget_gbps * (1 + 1e-9)


def max_kv_gbps(prefill: PrefillTime, kv: KVSize) -> float:
    """The highest KV rate one PrfaaS prefill emits, S(l) / T(l) over 1..128K tokens (Eq. 1):
    what a budget must leave room for before the head job's length is known."""
    ls = np.linspace(1.0, 131072.0, 512)
    return float((kv.size_bytes(ls) * 8 / 1e9 / prefill.time_s(ls)).max())


def blocked_destinations(budgets: Mapping[str, EgressBudget], running_gbps: Mapping[str, float],
                         running_jobs: Mapping[str, int], job_gbps: float) -> set[str]:
    """Destinations whose egress budget could not take one more prefill at `job_gbps` (the
    simulator's PrfaaS scheduler and the live gateway both ask this one rule)."""
    return {d for d, b in budgets.items()
            if not b.admits(running_gbps[d], job_gbps, running_jobs[d])}


@dataclass
class DestinationThreshold:
    planned_tokens: int
    max_tokens: int
    min_tokens: int = 0
    limit_s: float = 60.0
    step: float = 1.1
    ratio: float = 2.0
    hold_s: float | None = None  # least time between two moves of t (None: limit_s)
    threshold_tokens: int = field(init=False)
    changes: int = field(default=0, init=False)
    _moved_at_s: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.limit_s > 0 or not self.step > 1:
            raise ConfigError("threshold controller", (self.limit_s, self.step),
                              "need limit_s > 0 and step > 1")
        if self.hold_s is None:
            self.hold_s = self.limit_s
        if not self.hold_s >= 0:
            raise ConfigError("threshold controller hold_s", self.hold_s, "must be >= 0")
        self.threshold_tokens = self.planned_tokens

    def update(self, prfaas_wait_s: float, local_wait_s: float,
               now_s: float | None = None) -> int:
        """The threshold after seeing the two waits (call on each arrival). With `now_s` (the
        caller's time, any epoch) t moves at most once per `hold_s`: a move changes only
        where new arrivals go, so the backlogs it reacts to (>= limit_s of work) answer it
        only after about that long; without the hold the rule stepped on every arrival and
        ran t to its bounds within seconds of one long wait."""
        t = self.threshold_tokens
        if (now_s is not None and self._moved_at_s is not None
                and now_s - self._moved_at_s < (self.hold_s or 0.0)):
            return t
        if prfaas_wait_s > self.limit_s and prfaas_wait_s > self.ratio * local_wait_s:
            t = min(self.max_tokens, max(int(t * self.step), t + 1))
        elif local_wait_s > self.limit_s and local_wait_s > self.ratio * prfaas_wait_s:
            t = max(self.min_tokens, int(t / self.step))
        elif max(prfaas_wait_s, local_wait_s) < self.limit_s / 4 and t != self.planned_tokens:
            t = (max(self.planned_tokens, int(t / self.step)) if t > self.planned_tokens
                 else min(self.planned_tokens, max(int(t * self.step), t + 1)))
        if t != self.threshold_tokens:
            self.changes += 1
            self.threshold_tokens = t
            self._moved_at_s = now_s
        return t
