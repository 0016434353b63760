"""Short-term threshold controller: re-solves t from live estimates, with hysteresis.

Inputs, all read through the `ClusterView` at `view.now_s` (no clock of its own):
- the recent uncached-length distribution: a window of the last `window_requests` uncached
  lengths, fed by the router as requests arrive (`observe`);
- the bandwidth estimate `LinkStatus.capacity_gbps`, of which the planner may use
  `link_headroom` (default 0.9) so planned egress stays below capacity;
- egress utilisation (egress / capacity) and the PrfaaS queue (mean queued work per instance):
  when either crosses its limit the next solve runs at once instead of waiting for the period;
- the arrival rate of the window (its request count over its time span).

Solve: the planner's throughput model (`planner.throughput.stage_curves` + `bounds`, Eqs 3, 4,
6, 7) over the empirical window with the live bandwidth and the *current* instance counts
(PrfaaS and PD-P prefill instances seen in the view): t maximising
min(Θprfaas / p, Θpd-p / (1 - p)) - the Eq. 7 balance point. (`search_prfaas_pd` also moves
N_p, which is the rebalancer's job; fixing the split keeps the two timescales apart.) The
balance point maximises capacity, but a link cut below what the *offered* load sends needs more:
t is then raised to the smallest t whose egress at the window's arrival rate,
rate x P(L > t) x E[S_kv(L) | L > t], fits the usable bandwidth (`link_fit_threshold`).

Hysteresis: a solved t is adopted only if it differs from the current one by more than
`min_rel_change`. Moving t *up* (fewer offloads, less egress: the link-protecting direction)
happens on the first such solve; moving it *down* needs `agree_solves` consecutive solves that
all want a lower t, the adopted value being the highest of them. So t reacts to a bandwidth dip
within one period and returns to its optimum within `agree_solves` periods of recovery
(`recovery_time_s`). `history` lists (time_s, t) for every change (the metric).

Outages: while the view is degraded (no PrfaaS prefill instance up, no PD-P instance up, or the
link down) the controller does not solve: routing already falls back around the missing side
(policy/base.py), an outage says nothing about the workload, and a t solved for it (all or
nothing offloaded) would take `agree_solves` periods to undo after recovery. Lengths are still
observed, and the first due solve after recovery runs at once. Losing some instances of a side
is a real capacity change: t is re-solved for the instances up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, PRFAAS_CLUSTER, ClusterView, link_usable
from prfaas.planner.search import PlanInputs, threshold_grid
from prfaas.planner.throughput import bounds, stage_curves
from prfaas.workload.lengths import empirical


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    period_s: float = 5.0
    window_requests: int = 2000
    min_window: int = 50  # solves wait until this many lengths were seen
    link_headroom: float = 0.9
    utilization_limit: float = 0.85
    queue_limit_s: float = 10.0
    min_rel_change: float = 0.05
    agree_solves: int = 2
    mode: str = "exact"
    fit_offered_load: bool = False

    def __post_init__(self) -> None:
        for name in ("period_s", "queue_limit_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "must be positive")
        if self.window_requests < 1 or not 1 <= self.min_window <= self.window_requests:
            raise ConfigError("min_window", self.min_window,
                              f"must be in [1, window_requests={self.window_requests}]")
        if not 0 < self.link_headroom <= 1:
            raise ConfigError("link_headroom", self.link_headroom, "must be in (0, 1]")
        if self.agree_solves < 1:
            raise ConfigError("agree_solves", self.agree_solves, "must be >= 1")
        if self.min_rel_change < 0:
            raise ConfigError("min_rel_change", self.min_rel_change, "must be >= 0")

    @property
    def recovery_time_s(self) -> float:
        """Upper bound on the time from a lasting change to t following it downwards."""
        return self.period_s * (self.agree_solves + 1)


def solve_threshold(inputs: PlanInputs, n_prfaas: int, n_p: int, mode: str = "exact") -> int:
    """t balancing Eq. 7 for a fixed split (max over t of min(prfaas term, pd-p term))."""
    if n_prfaas < 1:
        return int(inputs.lengths.hi)  # nothing to offload to
    if n_p < 1:
        return max(int(inputs.lengths.lo) - 1, 0)
    ts = threshold_grid(inputs.lengths, inputs.t_step_tokens)
    curves = stage_curves(inputs.lengths, ts, inputs.prfaas_prefill, inputs.pd_prefill,
                          inputs.kv, mode)
    _, _, prf, pdp = bounds(curves, n_prfaas, n_p, inputs.link_gbps * 1e9 / 8)
    lam = np.nan_to_num(np.minimum(prf, pdp), nan=0.0, posinf=0.0)
    best = np.flatnonzero(lam >= lam.max() * (1 - 1e-9))
    return int(ts[best[len(best) // 2]])  # the middle of a flat optimum


def link_fit_threshold(inputs: PlanInputs, rate_rps: float) -> int:
    """Smallest t on the grid whose offloaded KV at `rate_rps` fits `inputs.link_gbps`."""
    ts = threshold_grid(inputs.lengths, inputs.t_step_tokens)
    support = inputs.lengths.support
    tail_bytes = np.cumsum((inputs.lengths.pmf * inputs.kv.size_bytes(support))[::-1])[::-1]
    idx = np.clip(np.floor(ts) - inputs.lengths.lo + 1, 0, support.size).astype(int)
    above = np.append(tail_bytes, 0.0)[idx]  # E[S 1{L > t}] per request
    fits = np.flatnonzero(rate_rps * above * 8 / 1e9 <= inputs.link_gbps)
    return int(ts[fits[0]]) if fits.size else int(ts[-1])


class ThresholdController:
    """Owns t; `observe` feeds lengths, `update(view)` may re-solve and returns t."""

    def __init__(self, inputs: PlanInputs, initial_tokens: int,
                 config: ControllerConfig | None = None) -> None:
        self.inputs = inputs
        self.config = config or ControllerConfig()
        self.t_tokens = int(initial_tokens)
        self._window: deque[int] = deque(maxlen=self.config.window_requests)
        self._times: deque[float] = deque(maxlen=self.config.window_requests)
        self._next_solve_s: float | None = None
        self._pending_down: list[int] = []
        self.history: list[tuple[float, int]] = []
        self.solves = 0
        self.last_solution: int | None = None

    def observe(self, uncached_tokens: int, arrival_s: float | None = None) -> None:
        """One request's post-prefix-match length (and arrival time, for the rate)."""
        self._window.append(max(int(uncached_tokens), 1))
        if arrival_s is not None:
            self._times.append(arrival_s)

    def limits_tokens(self) -> tuple[int, int] | None:
        """The ends of the t grid a solve searches now (`threshold_grid` over the window):
        (just below the shortest length, everything offloaded; the longest, nothing
        offloaded). None until a solve could run (fewer than `min_window` lengths). A t held
        at an end means the balance point lies outside what the link or the instances allow:
        the metric the "threshold pinned" alert reads."""
        if len(self._window) < self.config.min_window:
            return None
        return max(min(self._window) - 1, 0), max(self._window)

    def arrival_rps(self) -> float | None:
        if len(self._times) < 2 or self._times[-1] <= self._times[0]:
            return None
        return (len(self._times) - 1) / (self._times[-1] - self._times[0])

    def _urgent(self, view: ClusterView) -> bool:
        link = view.link()
        util = link.egress_gbps / max(link.capacity_gbps, 1e-12)
        prf = view.instances(PRFAAS_CLUSTER, "prefill")
        queue_s = sum(i.queued_work_s for i in prf) / len(prf) if prf else 0.0
        return util > self.config.utilization_limit or queue_s > self.config.queue_limit_s

    @staticmethod
    def _degraded(view: ClusterView) -> bool:
        return not (view.instances(PRFAAS_CLUSTER, "prefill")
                    and view.instances(PD_CLUSTER, "prefill") and link_usable(view.link()))

    def update(self, view: ClusterView) -> int:
        now = view.now_s
        if not self.history:
            self.history.append((now, self.t_tokens))
        if self._next_solve_s is None:
            self._next_solve_s = now + self.config.period_s
        # the time test first: `_urgent` reads every PrfaaS instance's queue (O(n))
        due = now >= self._next_solve_s or (now >= self._next_solve_s - self.config.period_s / 2
                                            and self._urgent(view))
        if not due or len(self._window) < self.config.min_window or self._degraded(view):
            return self.t_tokens
        self._next_solve_s = now + self.config.period_s
        self._apply(now, self._solve(view))
        return self.t_tokens

    def _solve(self, view: ClusterView) -> int:
        gbps = view.link().capacity_gbps * self.config.link_headroom
        inputs = replace(self.inputs, lengths=empirical(list(self._window), "window"),
                         link_gbps=max(gbps, 1e-6))
        n_prf = len(view.instances(PRFAAS_CLUSTER, "prefill"))
        n_p = len(view.instances(PD_CLUSTER, "prefill"))
        self.solves += 1
        t = solve_threshold(inputs, n_prf, n_p, self.config.mode)
        rate = self.arrival_rps()
        if self.config.fit_offered_load and rate is not None and n_prf > 0:
            t = max(t, link_fit_threshold(inputs, rate))
        self.last_solution = t
        return t

    def _apply(self, now_s: float, solved: int) -> None:
        cur = self.t_tokens
        if abs(solved - cur) <= self.config.min_rel_change * max(cur, 1):
            self._pending_down.clear()
            return
        if solved > cur:  # protect the link at once
            self._pending_down.clear()
            self._set(now_s, solved)
            return
        self._pending_down.append(solved)
        if len(self._pending_down) >= self.config.agree_solves:
            self._set(now_s, max(self._pending_down))
            self._pending_down.clear()

    def set_threshold(self, now_s: float, t: int) -> None:
        """From outside (the shape controller, with a new split): t now, pending moves down
        forgotten; the next solve starts from it."""
        self._pending_down.clear()
        if t != self.t_tokens:
            self._set(now_s, int(t))

    def _set(self, now_s: float, t: int) -> None:
        self.t_tokens = t
        self.history.append((now_s, t))

    def stats(self, end_s: float | None = None) -> dict[str, float]:
        """mean, min, max of t; the mean is time-weighted up to `end_s` when given (else the
        plain mean of the values adopted)."""
        hist = self.history or [(0.0, self.t_tokens)]
        ts = [t for _, t in hist]
        out = {"mean": float(np.mean(ts)), "min": float(min(ts)), "max": float(max(ts))}
        if end_s is not None and end_s > hist[0][0]:
            times = [s for s, _ in hist] + [max(end_s, hist[-1][0])]
            weights = np.diff(times)
            if weights.sum() > 0:
                out["mean"] = float(np.dot(weights, ts) / weights.sum())
        return out
