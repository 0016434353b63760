"""The queue-limit spill (policy/spill.py): keep, spill to the other route, or refuse, on a
scripted view. The live dispatcher and the simulator both call it."""

from collections import Counter
from dataclasses import replace

import pytest
from policy_fakes import FakeView, query, without

from prfaas.core.errors import ConfigError
from prfaas.core.types import LinkStatus, Route, RouteDecision
from prfaas.policy.base import decide
from prfaas.policy.spill import SpillAction, SpillPolicy

Q = query(30_000)


def chosen(route: Route, view: FakeView | None = None) -> RouteDecision:
    return decide(Q, view or FakeView(), route, 19_500, fallback=False)


def test_below_the_limit_the_decision_is_kept() -> None:
    d = chosen(Route.PRFAAS)
    got = SpillPolicy(4).admit(Q, FakeView(), d, Counter({d.prefill_instance: 3}))
    assert got.action is SpillAction.KEEP and got.decision is d


def test_without_a_limit_nothing_spills() -> None:
    d = chosen(Route.PRFAAS)
    got = SpillPolicy(None).admit(Q, FakeView(), d, Counter({d.prefill_instance: 10**6}))
    assert got.action is SpillAction.KEEP and got.decision is d


@pytest.mark.parametrize(("route", "other"), [(Route.PRFAAS, Route.PD),
                                              (Route.PD, Route.PRFAAS)])
def test_a_full_queue_spills_to_the_other_route(route: Route, other: Route) -> None:
    view = FakeView()
    d = chosen(route, view)
    got = SpillPolicy(4).admit(Q, view, d, Counter({d.prefill_instance: 4}))
    assert got.action is SpillAction.SPILL
    s = got.decision
    assert s.route is other and not s.rejected and s.decode_instance is not None
    assert s.prefill_instance == chosen(other, view).prefill_instance
    assert s.threshold_tokens == 19_500
    assert f"{d.prefill_instance} is full (4 waiting): spilled to {other.value}" in s.reason


def test_the_spill_goes_to_the_other_routes_best_instance() -> None:
    view = FakeView()
    view.set_queue("pd-p0", 3.0)  # pd-p1 drains first
    d = chosen(Route.PRFAAS, view)
    got = SpillPolicy(2).admit(Q, view, d, {d.prefill_instance: 2})
    assert got.decision.prefill_instance == "pd-p1"


def test_both_routes_full_is_refused_not_unavailable() -> None:
    view = FakeView()
    d, other = chosen(Route.PRFAAS, view), chosen(Route.PD, view)
    waiting = {d.prefill_instance: 4, other.prefill_instance: 4}
    got = SpillPolicy(4).admit(Q, view, d, waiting)
    assert got.action is SpillAction.FULL
    assert got.decision.rejected and not got.decision.unavailable  # 429, not 503
    assert "no other route has room" in got.decision.reason
    # one slot free on the other route: spilled after all
    waiting[other.prefill_instance] = 3
    assert SpillPolicy(4).admit(Q, view, d, waiting).action is SpillAction.SPILL


def test_a_full_local_queue_with_the_link_down_is_refused() -> None:
    view = without(FakeView(), link=LinkStatus(100.0, up=False))
    view.set_queue("pd-p0", 3.0)
    d = replace(chosen(Route.PD, view), prefill_instance="pd-p0")  # full, pd-p1 is not
    got = SpillPolicy(1).admit(Q, view, d, {"pd-p0": 1})
    # PrfaaS cannot be reached: no spill across, and no quiet move inside the same route
    assert got.action is SpillAction.FULL


def test_a_refusal_is_kept_as_it_is() -> None:
    d = RouteDecision.reject("slo")
    got = SpillPolicy(1).admit(Q, FakeView(), d, {"": 5})
    assert got.action is SpillAction.KEEP and got.decision is d


def test_a_limit_below_one_is_rejected() -> None:
    with pytest.raises(ConfigError, match="max_queued_per_prefill"):
        SpillPolicy(0)
