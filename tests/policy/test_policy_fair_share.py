"""The PrfaaS cluster's per-tenant share (policy/fair_share.py) and per-destination controls
(policy/region_control.py), each against FCFS as the negative control."""

import numpy as np
import pytest

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.policy.fair_share import make_share_policy
from prfaas.policy.region_control import DestinationThreshold, EgressBudget


def served_tokens(name: str, weights: dict[str, float], picks: int) -> dict[str, float]:
    """Both tenants backlogged (`a`'s 300 jobs queued first), `picks` jobs started."""
    rng = np.random.default_rng(7)
    policy = make_share_policy(name, weights)
    for tenant in ("a", "b"):
        for cost in rng.integers(2_000, 120_000, 300):
            policy.push(tenant, (tenant, int(cost)), float(cost))
    out = dict.fromkeys(weights, 0.0)
    for _ in range(picks):
        picked = policy.pick()
        assert picked is not None
        tenant, (_, cost) = picked
        out[tenant] += cost
    return out


def test_drr_shares_uncached_tokens_by_weight_and_fcfs_does_not() -> None:
    drr = served_tokens("drr", {"a": 3.0, "b": 1.0}, 200)
    # tokens served differ from the 3:1 weights by at most one job's cost per tenant
    total = drr["a"] + drr["b"]
    assert abs(drr["a"] / total - 0.75) <= 2 * 120_000 / total
    fcfs = served_tokens("fcfs", {"a": 3.0, "b": 1.0}, 200)
    assert fcfs["b"] == 0.0  # a's 300 queued jobs come first: no share at all


def test_a_light_tenant_is_next_behind_a_backlogged_one_under_drr_only() -> None:
    for name, expect_next in (("drr", True), ("fcfs", False)):
        policy = make_share_policy(name, {"hog": 1.0, "light": 0.1})
        for i in range(50):
            policy.push("hog", ("hog", i), 100_000.0)
        for _ in range(5):
            policy.pick()
        policy.push("light", ("light", 0), 100_000.0)
        nxt = policy.pick()
        assert nxt is not None
        assert (nxt[0] == "light") is expect_next, name


def test_blocked_tenants_are_skipped_and_keep_their_jobs() -> None:
    policy = make_share_policy("drr", {"a": 1.0, "b": 1.0})
    policy.push("a", "a0", 10.0)
    policy.push("b", "b0", 10.0)
    assert policy.pick(blocked={"a"}) == ("b", "b0")
    assert policy.pick(blocked={"a"}) is None
    assert policy.pick() == ("a", "a0")
    assert policy.pick() is None and len(policy) == 0


def test_a_cost_far_above_the_quantum_is_served_without_looping_per_quantum() -> None:
    policy = make_share_policy("drr", {"a": 1.0, "b": 1e-6}, quantum_tokens=1.0)
    for _ in range(3):
        policy.push("a", "big", 1e12)
        policy.push("b", "big", 1e12)
    got = [policy.pick() for _ in range(6)]
    assert sorted(g[0] for g in got if g) == ["a", "a", "a", "b", "b", "b"]


def test_bad_share_inputs_name_the_value() -> None:
    with pytest.raises(ConfigError, match=r"weights\.b"):
        make_share_policy("drr", {"a": 1.0, "b": 0.0})
    with pytest.raises(UnknownNameError):
        make_share_policy("lottery", {"a": 1.0})
    policy = make_share_policy("drr", {"a": 1.0})
    with pytest.raises(UnknownNameError):
        policy.push("z", "job", 1.0)


def test_egress_budget_admits_within_budget_and_one_job_when_idle() -> None:
    budget = EgressBudget(10.0)
    assert budget.admits(6.0, 3.5, 2)
    assert not budget.admits(7.0, 3.5, 2)
    assert budget.admits(0.0, 25.0, 0)  # nothing running: a large job may still start
    with pytest.raises(ConfigError):
        EgressBudget(0.0)


def test_destination_threshold_follows_the_longer_wait_and_returns_to_plan() -> None:
    ctl = DestinationThreshold(planned_tokens=20_000, max_tokens=131_072, min_tokens=127,
                               limit_s=10.0)
    assert ctl.update(prfaas_wait_s=5.0, local_wait_s=1.0) == 20_000  # under the limit
    for _ in range(5):
        ctl.update(prfaas_wait_s=60.0, local_wait_s=5.0)
    raised = ctl.threshold_tokens
    assert raised > 30_000
    assert ctl.update(prfaas_wait_s=60.0, local_wait_s=50.0) == raised  # not 2x the other
    for _ in range(50):
        ctl.update(prfaas_wait_s=0.5, local_wait_s=1.0)
    assert ctl.threshold_tokens == 20_000  # both drained: back to the plan
    for _ in range(5):
        ctl.update(prfaas_wait_s=1.0, local_wait_s=60.0)
    assert ctl.threshold_tokens < 13_000  # PD-P backed up: more offloads
    for _ in range(200):
        ctl.update(prfaas_wait_s=1.0, local_wait_s=600.0)
    assert ctl.threshold_tokens == 127  # never below min_tokens


def test_destination_threshold_moves_once_per_hold_given_the_time() -> None:
    """With the caller's time, t moves at most once per hold_s (default limit_s): a move
    shows in the backlogs only after about that long. Negative control: hold 0 moves on every
    call, the previous rule that ran t to its bounds in one long wait."""
    held = DestinationThreshold(planned_tokens=20_000, max_tokens=131_072, min_tokens=127)
    free = DestinationThreshold(planned_tokens=20_000, max_tokens=131_072, min_tokens=127,
                                hold_s=0.0)
    assert held.hold_s == held.limit_s
    for k in range(100):  # 100 arrivals in 10 s, each seeing a 200 s PrfaaS wait
        held.update(prfaas_wait_s=200.0, local_wait_s=1.0, now_s=1000.0 + 0.1 * k)
        free.update(prfaas_wait_s=200.0, local_wait_s=1.0, now_s=1000.0 + 0.1 * k)
    assert held.changes == 1 and held.threshold_tokens == 22_000
    assert free.changes == 20 and free.threshold_tokens == 131_072  # 1.1^20 x 20K > 128K
    assert held.update(200.0, 1.0, now_s=1000.0 + held.limit_s) == 24_200  # a hold later
    with pytest.raises(ConfigError):
        DestinationThreshold(planned_tokens=1, max_tokens=2, hold_s=-1.0)
