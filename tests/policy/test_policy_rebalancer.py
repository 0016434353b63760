"""Long-term rebalancer: Eq. 8 imbalance, persistence, cooldown, no flip-flop."""

from policy_fakes import FakeView

from prfaas.core.types import InstanceLoad
from prfaas.planner.search import inputs_from_scenario
from prfaas.policy.rebalancer import Rebalancer, RebalancerConfig, StageRates, stage_rates
from prfaas.scenario import load_scenario

CFG = RebalancerConfig(persist_s=60.0, cooldown_s=120.0, tolerance=0.15, decode_drain_s=30.0,
                       switch_s=5.0)
PREFILL_BOUND = StageRates(1.0, 1.0, 4.0, 0.5, 0.8)  # (1 + 1) / 4 = 0.5


def pd_view() -> FakeView:
    return FakeView(loads=[
        InstanceLoad("pd-p0", "pd", "prefill", queued_work_s=3.0),
        InstanceLoad("pd-p1", "pd", "prefill", queued_work_s=1.0),
        InstanceLoad("pd-d0", "pd", "decode", running=10),
        InstanceLoad("pd-d1", "pd", "decode", running=2),
        InstanceLoad("pd-d2", "pd", "decode", running=5)])


def test_persistent_prefill_bottleneck_moves_the_idlest_decoder() -> None:
    reb, view = Rebalancer(CFG), pd_view()
    assert reb.observe(0.0, PREFILL_BOUND, view) is None
    assert reb.observe(59.0, PREFILL_BOUND, view) is None
    change = reb.observe(60.0, PREFILL_BOUND, view)
    assert change is not None and change.instance_id == "pd-d1"
    assert (change.from_role, change.to_role) == ("decode", "prefill")
    assert change.drain_s == 35.0 and change.ratio == 0.5
    assert reb.observe(150.0, PREFILL_BOUND, view) is None  # cooldown
    assert reb.observe(180.0, PREFILL_BOUND, view) is not None


def test_an_interrupted_imbalance_does_not_move_roles() -> None:
    reb, view = Rebalancer(CFG), pd_view()
    balanced = StageRates(2.0, 2.0, 4.0, 0.5, 0.8)
    for now, rates in ((0.0, PREFILL_BOUND), (40.0, balanced), (50.0, PREFILL_BOUND),
                       (100.0, PREFILL_BOUND)):
        assert reb.observe(now, rates, view) is None
    assert reb.observe(110.0, PREFILL_BOUND, view) is not None


def test_decode_bound_moves_the_least_queued_prefill_and_keeps_one_per_role() -> None:
    reb = Rebalancer(CFG)
    decode_bound = StageRates(4.0, 4.0, 2.0, 1.0, 0.5)
    change = None
    for now in (0.0, 61.0):
        change = reb.observe(now, decode_bound, pd_view())
    assert change is not None and change.instance_id == "pd-p1" and change.drain_s == 6.0
    one_prefill = FakeView(loads=[InstanceLoad("pd-p0", "pd", "prefill"),
                                  InstanceLoad("pd-d0", "pd", "decode")])
    reb2 = Rebalancer(CFG)
    reb2.observe(0.0, decode_bound, one_prefill)
    assert reb2.observe(100.0, decode_bound, one_prefill) is None


def test_paper_optimum_split_is_left_alone_and_a_bad_split_is_corrected() -> None:
    inputs = inputs_from_scenario(load_scenario("paper-case-study"))
    at_optimum = stage_rates(inputs, 19_400, 3, 5, "paper")
    # paper Table 6: 1.61 + 1.64 vs 3.91 req/s
    assert abs(at_optimum.theta_prfaas_rps - 1.61) < 0.05
    assert abs(at_optimum.theta_pd_p_rps - 1.64) < 0.05
    assert abs(at_optimum.theta_pd_d_rps - 3.91) < 0.05
    reb = Rebalancer(CFG)
    for now in (0.0, 100.0, 300.0):
        assert reb.observe(now, at_optimum, pd_view()) is None  # moving one would be worse
    skewed = stage_rates(inputs, 19_400, 1, 7, "paper")
    assert reb.observe(400.0, skewed, pd_view()) is None  # the clock starts at the skew
    change = reb.observe(460.0, skewed, pd_view())
    assert change is not None and change.to_role == "prefill"
