"""Short-term threshold controller: live re-solve of t, hysteresis, recovery, ControlledRouter."""

from dataclasses import replace

import numpy as np
import pytest
from policy_fakes import FakeView, query

from prfaas.core.errors import ConfigError
from prfaas.core.types import InstanceLoad, LinkStatus
from prfaas.planner.search import PlanInputs, inputs_from_scenario
from prfaas.policy.base import make_router
from prfaas.policy.controller import ControllerConfig, ThresholdController, solve_threshold
from prfaas.scenario import load_scenario

GBPS = 1e9 / 8


@pytest.fixture(scope="module")
def inputs() -> PlanInputs:
    return inputs_from_scenario(load_scenario("paper-case-study"))


def paper_view(gbps: float, egress: float = 0.0) -> FakeView:
    loads = ([InstanceLoad(f"prf-{i}", "prfaas", "prefill") for i in range(4)]
             + [InstanceLoad(f"pd-p{i}", "pd", "prefill") for i in range(3)]
             + [InstanceLoad(f"pd-d{i}", "pd", "decode", free_slots=20) for i in range(5)])
    return FakeView(loads=loads, link_status=LinkStatus(gbps, egress_gbps=egress))


def test_solve_matches_the_paper_optimum_and_rises_when_the_link_shrinks(inputs: PlanInputs
                                                                         ) -> None:
    t_full = solve_threshold(replace(inputs, link_gbps=100.0), 4, 3, "paper")
    assert abs(t_full - 19_400) <= 300  # paper Table 6: t = 19.4K at N_p = 3
    t_dip = solve_threshold(replace(inputs, link_gbps=5.0), 4, 3, "paper")
    assert t_dip > t_full * 1.3
    # at the new t the planned egress fits the 5 Gbps link
    p = inputs.lengths.prob_above(t_dip)
    lam = 3 / inputs.pd_prefill.seconds(inputs.lengths.mean_below(t_dip)) * (1 - p) ** -1
    egress_gbps = lam * p * inputs.kv.bytes_for(inputs.lengths.mean_above(t_dip)) / GBPS
    assert egress_gbps <= 5.0 * 1.01
    assert solve_threshold(inputs, 0, 3) == inputs.lengths.hi  # no PrfaaS: keep all local


def feed(ctl: ThresholdController, inputs: PlanInputs, n: int, seed: int = 0) -> None:
    for length in inputs.lengths.sample(np.random.default_rng(seed), n):
        ctl.observe(int(length))


def test_dip_raises_t_within_one_period_and_recovery_returns_it(inputs: PlanInputs) -> None:
    cfg = ControllerConfig(period_s=5.0, window_requests=3000, agree_solves=2)
    ctl = ThresholdController(inputs, 19_400, cfg)
    feed(ctl, inputs, 3000)
    view = paper_view(100.0)
    for step in range(4):  # steady: t stays near the optimum, no oscillation
        view.now = 5.0 * step
        ctl.update(view)
    optimum = ctl.last_solution
    assert optimum is not None and abs(optimum - 19_400) / 19_400 < 0.1
    changes_before = len(ctl.history)
    view.link_status = LinkStatus(5.0, egress_gbps=6.0)  # the dip: egress above capacity
    view.now = 20.0
    t_dip = ctl.update(view)
    assert t_dip > optimum * 1.3  # moved up on the first solve of the dip
    view.link_status = LinkStatus(100.0, egress_gbps=5.0)  # recovery at 30 s
    times = np.arange(30.0, 30.0 + cfg.recovery_time_s + 0.01, 1.0)
    trace = []
    for now in times:
        view.now = float(now)
        trace.append(ctl.update(view))
    assert trace[0] == t_dip  # one solve is not enough to move down (hysteresis)
    assert abs(trace[-1] - optimum) <= cfg.min_rel_change * optimum  # back within the bound
    assert len(ctl.history) - changes_before == 2  # up once, down once
    stats = ctl.stats(end_s=float(times[-1]))
    assert stats["max"] == t_dip and stats["min"] <= optimum


def test_no_solve_before_the_window_fills_and_config_is_validated(inputs: PlanInputs) -> None:
    ctl = ThresholdController(inputs, 5_000, ControllerConfig(min_window=100))
    feed(ctl, inputs, 99)
    view = paper_view(100.0)
    view.now = 100.0
    ctl.update(view)
    view.now = 200.0
    assert ctl.update(view) == 5_000 and ctl.solves == 0
    with pytest.raises(ConfigError, match="link_headroom"):
        ControllerConfig(link_headroom=1.5)
    with pytest.raises(ConfigError, match="min_window"):
        ControllerConfig(window_requests=10, min_window=20)


def test_controlled_router_feeds_uncached_lengths_and_exposes_t(inputs: PlanInputs) -> None:
    router = make_router("cache-aware+controller", threshold_tokens=1_000, plan_inputs=inputs,
                         controller={"period_s": 1.0, "min_window": 20, "agree_solves": 1})
    view = paper_view(100.0)
    rng = np.random.default_rng(1)
    for k, length in enumerate(inputs.lengths.sample(rng, 60)):
        view.now = 0.1 * k
        d = router.route(query(int(length), {"pd-p0": 512}, rid=str(k)), view)
        assert d.threshold_tokens == router.threshold_tokens()
    assert router.threshold_tokens() != 1_000  # re-solved from the live window
    ctl = router.controller  # type: ignore[attr-defined]
    assert ctl.history[0] == (0.0, 1_000) and len(ctl.history) >= 2
    with pytest.raises(ConfigError, match="plan_inputs"):
        make_router("prfaas-threshold+controller", threshold_tokens=1_000)


def test_limits_are_the_grid_ends_and_a_starved_link_holds_t_at_the_top(inputs: PlanInputs
                                                                         ) -> None:
    cfg = ControllerConfig(period_s=1.0, min_window=200, agree_solves=1, fit_offered_load=True)
    ctl = ThresholdController(inputs, 19_400, cfg)
    lengths = [int(x) for x in inputs.lengths.sample(np.random.default_rng(3), 200)]
    for k, length in enumerate(lengths[:-1]):
        ctl.observe(length, 0.01 * k)
    assert ctl.limits_tokens() is None  # no solve can run yet: no range to be pinned in
    ctl.observe(lengths[-1], 2.0)
    low, high = ctl.limits_tokens() or (0, 0)
    assert (low, high) == (min(lengths) - 1, max(lengths))
    view = paper_view(100.0)
    view.now = 2.0
    t = ctl.update(view)
    assert low < t < high  # a healthy link: the balance point lies inside the range
    view = paper_view(1e-3)  # 1 Mbps: no offload at the window's rate fits
    view.now = 4.0
    assert ctl.update(view) == high  # held at the top: nothing offloaded
    router = make_router("prfaas-threshold", threshold_tokens=1_000)
    assert router.threshold_limits_tokens() is None  # a fixed t has no range
