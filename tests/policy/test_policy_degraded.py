"""Every router with parts of the system down: no PrfaaS cluster, no PD-P, a down link, no
decoders. The same policy objects must route around what is missing (policy/base.py)."""

from collections.abc import Callable

import numpy as np
import pytest
from policy_fakes import FakeView, query, without

from prfaas.core.types import LinkStatus, Route
from prfaas.planner.search import PlanInputs, inputs_from_scenario
from prfaas.policy.admission import AdmissionRouter
from prfaas.policy.base import Router, make_router
from prfaas.policy.controller import ControllerConfig, ThresholdController
from prfaas.scenario import load_scenario

T = 10_000
LONG, SHORT = 30_000, 2_000
DOWN = LinkStatus(100.0, up=False)


@pytest.fixture(scope="module")
def inputs() -> PlanInputs:
    return inputs_from_scenario(load_scenario("paper-case-study"))


# routers whose own choice for a long request is PrfaaS and for a short one PD (on FakeView)
THRESHOLD_ROUTERS = ["prfaas-threshold", "cache-aware", "prfaas-threshold+controller",
                     "cache-aware+controller"]
ALL_ROUTERS = [*THRESHOLD_ROUTERS, "all-pd", "all-prfaas", "load-balance",
               "local-cache-aware", "global-cache-aware"]


def build(name: str, inputs: PlanInputs) -> Router:
    return make_router(name, threshold_tokens=T, plan_inputs=inputs)


def test_fake_view_sends_long_remote_and_short_local(inputs: PlanInputs) -> None:
    for name in THRESHOLD_ROUTERS:  # the premise of the fallbacks below
        router = build(name, inputs)
        assert router.route(query(LONG), FakeView()).route is Route.PRFAAS, name
        assert router.route(query(SHORT), FakeView()).route is Route.PD, name


@pytest.mark.parametrize("name", ALL_ROUTERS)
@pytest.mark.parametrize("degrade", [
    lambda v: without(v, "prf-"),  # the PrfaaS cluster is down
    lambda v: without(v, link=DOWN),  # the link is partitioned
    lambda v: without(v, link=LinkStatus(0.0)),  # no capacity counts as down
], ids=["no-prfaas", "link-down", "link-zero"])
def test_without_a_reachable_prfaas_everything_goes_local(
        name: str, degrade: Callable[[FakeView], FakeView], inputs: PlanInputs) -> None:
    router, view = build(name, inputs), degrade(FakeView())
    for n in (LONG, SHORT, 200_000):
        d = router.route(query(n, {"prf-0": n - 100}), view)
        assert not d.rejected, (name, d.reason)
        assert d.route is Route.PD and d.prefill_instance.startswith("pd-p"), name
        assert d.decode_instance is not None and d.decode_instance.startswith("pd-d")
        assert d.prefix_source is None and d.prefix_transfer_tokens == 0  # nothing crosses
        assert d.cached_tokens == 0  # PrfaaS's cache is out of reach


@pytest.mark.parametrize("name", ALL_ROUTERS)
def test_without_pd_p_short_requests_go_to_prfaas_while_the_link_is_up(
        name: str, inputs: PlanInputs) -> None:
    router, view = build(name, inputs), without(FakeView(), "pd-p")
    for n in (SHORT, LONG):
        d = router.route(query(n), view)
        assert not d.rejected and d.route is Route.PRFAAS, (name, d.reason)
        assert d.prefill_instance.startswith("prf-") and d.decode_instance == "pd-d0"


@pytest.mark.parametrize("name", ALL_ROUTERS)
@pytest.mark.parametrize("case,why", [
    ("no-pd-p-link-down", "link is down"),
    ("no-prefill", "no PrfaaS prefill instance up"),
    ("no-decode", "no decode instance up"),
])
def test_no_path_is_rejected_as_unavailable_with_the_reason(
        name: str, case: str, why: str, inputs: PlanInputs) -> None:
    view = {"no-pd-p-link-down": without(FakeView(), "pd-p", link=DOWN),
            "no-prefill": without(FakeView(), "pd-p", "prf-"),
            "no-decode": without(FakeView(), "pd-d")}[case]
    router = build(name, inputs)
    for n in (SHORT, LONG):
        d = router.route(query(n), view)
        assert d.rejected and d.unavailable, (name, case)
        assert why in d.reason, d.reason
        assert d.decode_instance is None and d.prefill_instance == ""


def test_a_partial_outage_uses_the_instances_left() -> None:
    view = without(FakeView(), "prf-0", "pd-p1", "pd-d0")
    for name in ("prfaas-threshold", "cache-aware"):
        router = make_router(name, threshold_tokens=T)
        long, short = router.route(query(LONG), view), router.route(query(SHORT), view)
        assert (long.prefill_instance, long.decode_instance) == ("prf-1", "pd-d1")
        assert (short.prefill_instance, short.decode_instance) == ("pd-p0", "pd-d1")
        assert not long.reason.startswith("prfaas unavailable")


def test_fallback_is_said_in_the_reason() -> None:
    d = make_router("prfaas-threshold", threshold_tokens=T).route(query(LONG),
                                                                  without(FakeView(), "prf-"))
    assert d.reason == "prfaas unavailable: fell back to pd"


def test_admission_keeps_no_path_apart_from_its_own_rejections() -> None:
    router = AdmissionRouter(make_router("prfaas-threshold", threshold_tokens=T), 3.0)
    no_path = router.route(query(SHORT), without(FakeView(), "pd-d"))
    assert no_path.rejected and no_path.unavailable and router.rejected == 0
    view = without(FakeView(), "prf-")
    fell_back = router.route(query(5_000), view)  # 2.1 s on an idle PD-P: admitted
    assert not fell_back.rejected and fell_back.route is Route.PD
    for inst in ("pd-p0", "pd-p1"):
        view.set_queue(inst, 2.0)
    slo = router.route(query(LONG), view)  # the fallback's TTFT is what admission judges
    assert slo.rejected and not slo.unavailable and router.rejected == 1


def test_controller_holds_t_through_an_outage_and_solves_on_recovery(inputs: PlanInputs
                                                                     ) -> None:
    ctl = ThresholdController(inputs, T, ControllerConfig(period_s=5.0, min_window=50))
    for length in inputs.lengths.sample(np.random.default_rng(0), 500):
        ctl.observe(int(length))
    views = {"no-prfaas": without(FakeView(), "prf-"), "no-pd-p": without(FakeView(), "pd-p"),
             "link-down": without(FakeView(), link=DOWN)}
    for k, view in enumerate(views.values()):
        for step in range(4):
            view.now = 10.0 * (4 * k + step)
            assert ctl.update(view) == T
    assert ctl.solves == 0 and ctl.history == [(0.0, T)]
    healthy = FakeView(now=200.0)
    ctl.update(healthy)
    assert ctl.solves == 1  # the first update after recovery solves at once
