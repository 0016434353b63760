"""The paper's case study (Table 6) from the shipped scenario, within the issue's tolerances."""

import pytest

from prfaas.core.errors import ConfigError, InfeasibleError
from prfaas.planner.search import PlanInputs, inputs_from_scenario, plan_all, search_prfaas_pd
from prfaas.scenario import load_scenario, parse_scenario


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("paper-case-study")


def test_paper_mode_reproduces_table6(scenario) -> None:
    plan = plan_all(scenario, "paper").systems
    prf, hom, naive = plan["prfaas_pd"], plan["homogeneous_pd"], plan["naive_heterogeneous"]
    assert (prf.n_prfaas, prf.n_p, prf.n_d) == (4, 3, 5)
    assert (hom.n_p, hom.n_d) == (9, 3)
    assert (naive.n_prfaas, naive.n_d) == (4, 8)
    assert prf.lambda_max == pytest.approx(3.24, rel=0.04)
    assert hom.lambda_max == pytest.approx(2.11, rel=0.04)
    assert naive.lambda_max == pytest.approx(2.45, rel=0.04)
    assert prf.threshold_tokens == pytest.approx(19400, rel=0.05)
    assert prf.offload_fraction == pytest.approx(0.496, abs=0.03)
    assert prf.egress_gbps == pytest.approx(13, rel=0.15)
    assert prf.lambda_max > naive.lambda_max > hom.lambda_max


def test_exact_mode_is_below_paper_mode(scenario) -> None:
    """T is convex in l, so E[T(L)] >= T(E[L]): the representative length overstates."""
    paper = plan_all(scenario, "paper").systems
    exact = plan_all(scenario, "exact").systems
    for name in paper:
        assert exact[name].lambda_max <= paper[name].lambda_max


def test_optimum_balances_prfaas_and_pdp_terms(scenario) -> None:
    """Eq. 7: at the optimal t the two prefill terms are (nearly) equal when decode is slack."""
    prf = plan_all(scenario, "paper").systems["prfaas_pd"]
    p = prf.offload_fraction
    assert prf.theta_pd_d > prf.lambda_max
    assert prf.theta_prfaas / p == pytest.approx(prf.theta_pd_p / (1 - p), rel=0.02)


def test_link_bound_moves_threshold_up(scenario) -> None:
    """With a thin link the PrfaaS side becomes bandwidth-bound and fewer requests go there."""
    base = inputs_from_scenario(scenario)
    thin = PlanInputs(**{**base.__dict__, "link_gbps": 2.0})
    wide = search_prfaas_pd(base, "paper")
    narrow = search_prfaas_pd(thin, "paper")
    assert narrow.extra["prfaas_limited_by"] == "bandwidth"
    assert narrow.threshold_tokens > wide.threshold_tokens
    assert narrow.egress_gbps <= 2.0 + 1e-9


def _raw(scenario) -> dict:
    import copy
    return copy.deepcopy(scenario.raw)


def test_zero_instances_rejected_naming_field(scenario) -> None:
    raw = _raw(scenario)
    raw["clusters"]["prfaas"]["instances"] = 0
    with pytest.raises(ConfigError, match=r"clusters\.prfaas\.instances"):
        parse_scenario(raw)


def test_zero_bandwidth_rejected_naming_field(scenario) -> None:
    raw = _raw(scenario)
    raw["link"]["gbps"] = 0
    with pytest.raises(ConfigError, match=r"link\.gbps"):
        parse_scenario(raw)
    base = inputs_from_scenario(scenario)
    with pytest.raises(ConfigError, match=r"link\.gbps=-1"):
        search_prfaas_pd(PlanInputs(**{**base.__dict__, "link_gbps": -1.0}), "paper")


def test_a_dead_link_keeps_everything_local_and_infeasible_names_the_binding_stage(scenario
                                                                                    ) -> None:
    """A 0 Gbps link (a live controller's measured outage) is not infeasible: every request
    stays in the PD cluster. Only when no stage can prefill at all is there no plan, and the
    error says which stages are zero."""
    base = inputs_from_scenario(scenario)
    dead = search_prfaas_pd(PlanInputs(**{**base.__dict__, "link_gbps": 0.0}), "paper")
    assert dead.offload_fraction == 0.0 and dead.egress_gbps == 0.0 and dead.lambda_max > 0
    assert dead.threshold_tokens == base.lengths.hi and dead.l_long_tokens is None
    alone = PlanInputs(**{**base.__dict__, "link_gbps": 0.0, "n_pd": 1})
    with pytest.raises(InfeasibleError, match=r"binding constraint: PD-P .*instances=1.*"
                                              r"PrfaaS side .*link\.gbps=0\.0"):
        search_prfaas_pd(alone, "paper")
    with pytest.raises(InfeasibleError, match=r"clusters\.pd\.instances=0.*pd_d"):
        search_prfaas_pd(PlanInputs(**{**base.__dict__, "n_pd": 0}), "paper")
    # one PD instance and a live link: all prefill on PrfaaS, as the naive system does
    only_prfaas = search_prfaas_pd(PlanInputs(**{**base.__dict__, "n_pd": 1}), "paper")
    assert (only_prfaas.n_p, only_prfaas.offload_fraction) == (0, 1.0)


def test_equal_cost_comparison_uses_scenario_costs(scenario) -> None:
    """H200 = 2 x H20 (derived from the paper's '+15% at equal cost'): PrfaaS-PD costs
    32*2 + 64 = 128 units/h against 96 for homogeneous PD."""
    plan = plan_all(scenario, "paper").systems
    assert plan["prfaas_pd"].cost_per_hour == 128
    assert plan["homogeneous_pd"].cost_per_hour == 96
    per_cost = plan["prfaas_pd"].lambda_max / 128 / (plan["homogeneous_pd"].lambda_max / 96)
    assert 1.1 < per_cost < 1.3
