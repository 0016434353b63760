"""The shape controller on hand-computed cases, each with its negative control.

Profiles chosen so the planner's figures are sums by hand: PD prefill T(l) = 1e-3 l s, PrfaaS
prefill T(l) = 0.25e-3 l s, decoders of BS_max 10 at 0.1 s a step (10 / (0.1 x 100) = 1 req/s
each at 100 output tokens), KV 1 byte a token over a link that never binds.
"""

from __future__ import annotations

import pytest
from policy_fakes import FakeView

from prfaas.core.errors import ConfigError
from prfaas.core.types import InstanceLoad, LinkStatus
from prfaas.models.profile import DecodeTime, KVSize, PrefillTime
from prfaas.planner.search import PlanInputs, search_prfaas_pd
from prfaas.policy.shape import Refusal, ShapeChange, ShapeConfig, ShapeController, apply_threshold
from prfaas.policy.threshold import ThresholdRouter
from prfaas.workload.lengths import empirical, fixed

PD = PrefillTime(0.0, 1e-3, 0.0)
PRF = PrefillTime(0.0, 0.25e-3, 0.0)
INPUTS = PlanInputs(lengths=fixed(1000), output_tokens=100, kv=KVSize(0.0, 1.0),
                    prfaas_prefill=PRF, pd_prefill=PD, decode=DecodeTime(10, 0.1),
                    n_prfaas=0, n_pd=4, link_gbps=1000.0, t_step_tokens=100)
CFG = ShapeConfig(period_s=10.0, min_window=20, persist_s=20.0, cooldown_s=30.0, hold_s=100.0,
                  switch_s=5.0, payback_s=300.0, window_s=1000.0)


def view(n_p: int, n_d: int, prfaas: int = 0, now: float = 0.0, running: int = 0,
         queued_s: float = 0.0) -> FakeView:
    loads = [InstanceLoad(f"prf-{i}", "prfaas", "prefill") for i in range(prfaas)]
    loads += [InstanceLoad(f"pd-p{i}", "pd", "prefill", queued_work_s=queued_s + i)
              for i in range(n_p)]
    loads += [InstanceLoad(f"pd-d{i}", "pd", "decode", running=running + i) for i in range(n_d)]
    return FakeView(loads=loads, link_status=LinkStatus(1000.0), now=now)


def feed(ctl: ShapeController, lengths: list[int], start_s: float = 0.0, output: int = 100
         ) -> None:
    for k, n in enumerate(lengths):
        ctl.observe(start_s + k * 0.01, n, output)


def run(ctl: ShapeController, v: FakeView, until_s: float, step_s: float = 10.0
        ) -> list[ShapeChange | Refusal]:
    out: list[ShapeChange | Refusal] = []
    t = v.now
    while t <= until_s:
        v.now = t
        got = ctl.tick(v)
        if got is not None:
            out.append(got)
        t += step_s
    return out


def test_long_prompts_move_decoders_to_prefill_after_persisting() -> None:
    # 3000-token prompts, all local (no PrfaaS): T = 3 s a request, so with 4 PD instances
    # 1:3 -> min(1/3, 3) = 0.333, 2:2 -> min(2/3, 2) = 0.667, 3:1 -> min(1, 1) = 1 req/s
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [3000] * 40)
    v = view(1, 3)
    got = run(ctl, v, 20.0)  # solves at 10 and 20 s: the direction holds for 10 s only
    assert got == []
    solve = ctl.last_solve
    assert solve is not None
    assert [round(p.lambda_rps, 4) for p in solve.plans] == [0.3333, 0.6667, 1.0]
    assert (solve.best.n_p, solve.current.n_p) == (3, 1)
    v.now = 30.0
    change = ctl.tick(v)
    assert isinstance(change, ShapeChange)
    # the idlest decoder (running 0 -> drain 0) moves; gain (0.667 - 0.333) x 300 = 100 req;
    # cost: without it 1:2 still gives 0.333 (prefill binds), so 0 req
    assert (change.instance_id, change.from_role, change.to_role) == ("pd-d0", "decode",
                                                                      "prefill")
    assert change.split_from == (1, 3) and change.split_to == (2, 2)
    assert change.gain_requests == pytest.approx(100.0, rel=1e-6)
    assert change.cost_requests == 0.0 and change.drain_s == 0.0
    assert "1:3" in change.reason and "2:2" in change.reason
    # one change at a time
    assert run(ctl, view(1, 3, now=40.0), 100.0) == []
    assert ctl.busy is change


def test_the_optimal_split_is_left_alone() -> None:
    # negative control: 1000-token prompts: 1:3 -> 1, 2:2 -> min(2, 2) = 2, 3:1 -> 1;
    # 2:2 is the optimum and stays so for as long as the window says so
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [1000] * 40)
    assert run(ctl, view(2, 2), 500.0) == []
    assert ctl.last_solve is not None and ctl.last_solve.best.n_p == 2
    assert ctl.outcomes == {}


def test_a_short_lived_shift_moves_nothing() -> None:
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [3000] * 40)
    v = view(1, 3)
    assert run(ctl, v, 20.0) == []  # wants prefill at 10 and 20 s
    ctl2 = ShapeController(INPUTS, CFG)  # the same, with the mix back to optimal in between
    feed(ctl2, [3000] * 40)
    v2 = view(1, 3)
    assert run(ctl2, v2, 10.0) == []
    feed(ctl2, [250] * 2000, start_s=11.0)  # 250-token prompts: 1:3 is best (min(4, 3) = 3)
    assert run(ctl2, view(1, 3, now=20.0), 200.0) == []
    assert ctl2.last_solve is not None and ctl2.last_solve.best.n_p == 1


def test_the_move_back_within_hold_is_refused_as_a_flap_and_reported_once() -> None:
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [3000] * 40)
    change = run(ctl, view(1, 3), 30.0)[-1]
    assert isinstance(change, ShapeChange)
    ctl.finished(change.instance_id, 40.0, ok=True)
    # the mix flips to short prompts: 2:2 now wants 1:3 (250 tokens: 1:3 -> 3 vs 2:2 -> 2)
    ctl._window.clear()
    feed(ctl, [250] * 40, start_s=41.0)
    got = run(ctl, view(2, 2, now=50.0), 130.0)
    flaps = [g for g in got if isinstance(g, Refusal)]
    assert len(flaps) == 1 and flaps[0].kind == "flap"  # reported once, not every tick
    assert "pd-d0" in flaps[0].reason and "hold_s 100" in flaps[0].reason
    assert not any(isinstance(g, ShapeChange) for g in got)
    # past the hold (ended 40 s + 100 s) the move back is allowed
    later = run(ctl, view(2, 2, now=150.0), 150.0)
    assert len(later) == 1 and isinstance(later[0], ShapeChange)
    assert later[0].to_role == "decode" and ctl.outcomes["refused_flap"] == 1


def test_cooldown_spaces_two_moves_in_the_same_direction() -> None:
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [3000] * 40)
    first = run(ctl, view(1, 3), 30.0)[-1]
    assert isinstance(first, ShapeChange)
    ctl.finished(first.instance_id, 35.0, ok=True)
    # 2:2 still wants 3:1; the direction must persist 20 s again and the cooldown ends at 65 s
    got = run(ctl, view(2, 2, now=40.0), 60.0)
    assert got == []
    second = run(ctl, view(2, 2, now=70.0), 70.0)
    assert len(second) == 1 and isinstance(second[0], ShapeChange)
    assert second[0].split_to == (3, 1)


def cached_window(ctl: ShapeController) -> None:
    """40 prompts of 250 tokens, 200 of them cached (uncached 50: T = 0.05 s), reused at
    pd-p0 20 times, pd-p1 15, pd-p2 5; each reuse saved T(250) - T(250 | 200) = 0.2 s."""
    where = ["pd-p0"] * 20 + ["pd-p1"] * 15 + ["pd-p2"] * 5
    for k, inst in enumerate(where):
        ctl.observe(k * 0.01, 250, 100, 200, inst, 200)


def test_the_cheapest_instance_moves_and_a_move_that_does_not_pay_back_is_declined() -> None:
    # 3:1 on 50-token work: 3:1 -> min(60, 1) = 1, 2:2 -> 2, 1:3 -> 3: one PD-P to decode,
    # gain (2 - 1) x payback_s; cost = lost cache / T_pd-p (prefill does not bind: without
    # the instance 2:1 still gives 1): pd-p0 0.2 x 20 / 0.05 = 80 req, pd-p1 60, pd-p2 20
    ctl = ShapeController(INPUTS, CFG)
    cached_window(ctl)
    got = run(ctl, view(3, 1), 30.0)
    assert len(got) == 1 and isinstance(got[0], ShapeChange)
    change = got[0]
    assert change.instance_id == "pd-p2" and change.to_role == "decode"
    assert change.cache_lost_s == pytest.approx(1.0)
    assert change.cost_requests == pytest.approx(20.0)
    assert change.gain_requests == pytest.approx(300.0)
    # the same with a payback of 1 s: the gain is 1 request, the cheapest costs 20: declined,
    # reported once
    short = ShapeConfig(period_s=10.0, min_window=20, persist_s=20.0, switch_s=5.0,
                        payback_s=1.0, window_s=1000.0)
    ctl2 = ShapeController(INPUTS, short)
    cached_window(ctl2)
    got2 = run(ctl2, view(3, 1), 200.0)
    assert len(got2) == 1 and isinstance(got2[0], Refusal) and got2[0].kind == "cost"
    assert got2[0].instance_id == "pd-p2" and "not worth it" in got2[0].reason
    assert ctl2.busy is None and ctl2.outcomes == {"refused_cost": 1}


def test_a_decoders_drain_is_priced_when_decode_binds() -> None:
    # 250-token prompts, 3:1 (decode binds at 1 req/s) asked by an operator to move the only
    # decoder's peer... use 2:2 -> 3:1 on 250 tokens (2 -> 1: a loss) requested: the price
    # shows it; a decoder running 4 sequences drains 100 steps x 0.1 s = 10 s
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [250] * 40)
    change = ctl.review("pd-d1", "prefill", view(2, 2, running=3))
    assert isinstance(change, ShapeChange) and change.requested
    assert change.drain_s == pytest.approx(10.0)
    # without it 2:1 gives 1 instead of 2: (2 - 1) x (10 + 5) s = 15 requests
    assert change.cost_requests == pytest.approx(15.0)
    assert change.gain_requests == pytest.approx((1.0 - 2.0) * 300.0)


def test_review_refuses_empty_role_busy_unknown_and_same_role() -> None:
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [1000] * 40)
    v = view(1, 1)
    empty = ctl.review("pd-d0", "prefill", v)
    assert isinstance(empty, Refusal) and empty.kind == "empty_role"
    assert "would leave 0 decode" in empty.reason
    assert isinstance(ctl.review("pd-x", "prefill", v), Refusal)
    assert ctl.review("pd-x", "prefill", v).kind == "unknown"  # type: ignore[union-attr]
    same = ctl.review("pd-p0", "prefill", v)
    assert isinstance(same, Refusal) and same.kind == "same_role"
    ok = ctl.review("pd-d0", "prefill", view(1, 2))  # the control: 1:2 -> 2:1 is allowed
    assert isinstance(ok, ShapeChange) and ok.requested and ok.split_to == (2, 1)
    busy = ctl.review("pd-d1", "prefill", view(1, 2))
    assert isinstance(busy, Refusal) and busy.kind == "busy" and "pd-d0" in busy.reason
    assert ctl.outcomes == {"refused_empty_role": 1, "refused_unknown": 2,
                            "refused_same_role": 1, "requested": 1, "refused_busy": 1}


def test_a_failed_change_frees_the_controller_without_counting_as_a_move() -> None:
    ctl = ShapeController(INPUTS, CFG)
    feed(ctl, [3000] * 40)
    change = run(ctl, view(1, 3), 30.0)[-1]
    assert isinstance(change, ShapeChange)
    with pytest.raises(ConfigError):
        ctl.finished("pd-d9", 31.0, ok=True)  # not the instance in progress
    ctl.finished(change.instance_id, 40.0, ok=False, detail="restart failed")
    assert ctl.busy is None and ctl.outcomes["failed"] == 1
    assert ctl._last is None  # no flap hold from a change that did not happen


def test_prfaas_share_and_ties_keep_the_current_split() -> None:
    # half 1000, half 4000 tokens, one PrfaaS instance: with 1000 <= t < 4000 the long half
    # goes remote: Θprfaas = 1 / (4000 x 0.25e-3) = 1 req/s -> term 1 / 0.5 = 2; PD-P term
    # n_p / 1 s / 0.5 = 2 n_p; decode n_d. 1:3 -> 2, 2:2 -> 2, 3:1 -> 1: a tie, no move
    inputs = PlanInputs(**{**INPUTS.__dict__, "n_prfaas": 1})
    ctl = ShapeController(inputs, CFG)
    feed(ctl, [1000, 4000] * 20)
    assert run(ctl, view(1, 3, prfaas=1), 200.0) == []
    solve = ctl.last_solve
    assert solve is not None and solve.n_prfaas == 1
    assert [round(p.lambda_rps, 6) for p in solve.plans] == [2.0, 2.0, 1.0]
    assert 1000 <= solve.best.threshold_tokens < 4000 and solve.best.offload_fraction == 0.5
    # negative control: the PrfaaS instance down -> everything local (2.5 s a request):
    # 1:3 -> 0.4, 2:2 -> 0.8, 3:1 -> 1.0: now 1:3 moves
    ctl2 = ShapeController(inputs, CFG)
    feed(ctl2, [1000, 4000] * 20)
    got = run(ctl2, view(1, 3, prfaas=0), 30.0)
    assert len(got) == 1 and isinstance(got[0], ShapeChange)
    assert got[0].lambda_from_rps == pytest.approx(0.4)
    assert got[0].lambda_to_rps == pytest.approx(0.8)


def test_the_controller_agrees_with_the_planners_own_search() -> None:
    # the planner's search over (t, N_p) on the same empirical lengths finds the same optimum
    # as the controller's per-split solves (one code path for t: split_optimum)
    lengths = [200 + 37 * k % 3900 for k in range(300)]
    inputs = PlanInputs(**{**INPUTS.__dict__, "n_prfaas": 1, "link_gbps": 1e-5 * 8,
                           "lengths": empirical(lengths)})
    plan = search_prfaas_pd(inputs, "exact")
    ctl = ShapeController(inputs, ShapeConfig(link_headroom=1.0, min_window=20))
    feed(ctl, lengths)
    solve = ctl.solve(FakeView(loads=view(1, 3, prfaas=1).loads,
                               link_status=LinkStatus(1e-5 * 8)))
    assert solve is not None
    assert solve.best.lambda_rps == pytest.approx(plan.lambda_max, rel=1e-9)
    assert solve.best.n_p == plan.n_p and solve.best.threshold_tokens == plan.threshold_tokens


def test_apply_threshold_sets_a_fixed_router() -> None:
    router = ThresholdRouter(100)
    assert apply_threshold(router, 2500, 0.0)
    assert router.threshold_tokens() == 2500


def test_bad_config_is_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match=r"shape\.min_per_role"):
        ShapeConfig(min_per_role=0)
    with pytest.raises(ConfigError, match=r"shape\.bogus"):
        ShapeConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match=r"shape\.period_s"):
        ShapeConfig.from_dict({"period_s": 0})
