"""Admission control, Mooncake baselines and the registry."""

import pytest
from policy_fakes import FakeView, query

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.core.types import LinkStatus, Route
from prfaas.policy.admission import AdmissionRouter, predict_ttft_s
from prfaas.policy.base import make_router, router_names
from prfaas.policy.mooncake import GlobalCacheAwareRouter
from prfaas.policy.threshold import ThresholdRouter


def test_admission_rejects_when_predicted_ttft_exceeds_the_slo_and_counts() -> None:
    view = FakeView()
    router = AdmissionRouter(ThresholdRouter(10_000), ttft_slo_s=3.0)
    ok = router.route(query(5_000), view)  # 0.1 + 4e-4 * 5000 = 2.1 s on an idle PD-P
    assert not ok.rejected and router.rejected == 0
    for inst in ("pd-p0", "pd-p1"):
        view.set_queue(inst, 2.0)
    no = router.route(query(5_000), view)
    assert no.rejected and "SLO" in no.reason and no.threshold_tokens == 10_000
    assert router.rejected == 1 and router.threshold_tokens() == 10_000


def test_predicted_ttft_overlaps_the_link_when_pipelined() -> None:
    view = FakeView(link_status=LinkStatus(1.0))  # 20000 tokens of KV: 8 s on 1 Gbps
    q = query(20_000)
    d = ThresholdRouter(10_000).route(q, view)
    assert d.route is Route.PRFAAS
    prefill_s, kv_s = 0.1 + 1e-4 * 20_000, 20_000 * 50_000 * 8 / 1e9
    assert predict_ttft_s(d, q, view, pipelined=True) == pytest.approx(max(prefill_s, kv_s))
    assert predict_ttft_s(d, q, view, pipelined=False) == pytest.approx(prefill_s + kv_s)
    wrapped = make_router("prfaas-threshold", threshold_tokens=10_000, ttft_slo_s=5.0)
    assert wrapped.route(q, view).rejected
    with pytest.raises(ConfigError, match="ttft_slo_s"):
        AdmissionRouter(ThresholdRouter(1), 0.0)


def test_load_balance_is_cache_blind() -> None:
    view = FakeView()
    for inst, q_s in (("pd-p0", 1.0), ("pd-p1", 3.0), ("prf-0", 2.0), ("prf-1", 0.5)):
        view.set_queue(inst, q_s)
    d = make_router("load-balance").route(query(8_000, {"pd-p1": 7_900}), view)
    assert d.prefill_instance == "prf-1" and d.route is Route.PRFAAS and d.cached_tokens == 0


def test_local_cache_aware_uses_own_cache_unless_the_queue_outweighs_it() -> None:
    view = FakeView(sec_per_token={"pd": 4e-4, "prfaas": 4e-4})
    router = make_router("local-cache-aware")
    d = router.route(query(8_000, {"pd-p1": 6_000}), view)
    assert d.prefill_instance == "pd-p1" and d.cached_tokens == 6_000 and d.prefix_source is None
    view.set_queue("pd-p1", 10.0)
    d = router.route(query(8_000, {"pd-p1": 6_000}), view)
    assert d.prefill_instance != "pd-p1" and d.cached_tokens == 0


def test_global_cache_aware_fetches_a_prefix_only_past_the_balance_ratio() -> None:
    view = FakeView(sec_per_token={"pd": 4e-4, "prfaas": 4e-4})
    view.set_queue("pd-p1", 10.0)
    view.set_queue("prf-0", 10.0)
    view.set_queue("prf-1", 10.0)
    router = GlobalCacheAwareRouter(balance_ratio=1.5)
    d = router.route(query(8_000, {"pd-p1": 6_000}), view)
    assert d.prefill_instance == "pd-p0" and d.prefix_source == "pd-p1"
    assert d.prefix_transfer_tokens == 6_000 and d.cached_tokens == 6_000
    # pd-p0 holds 5000 of the 6000: ratio 1.2 <= 1.5, so it uses its own 5000
    d = router.route(query(8_000, {"pd-p1": 6_000, "pd-p0": 5_000}), view)
    assert d.prefill_instance == "pd-p0" and d.prefix_source is None and d.cached_tokens == 5_000


def test_registry_knows_every_policy() -> None:
    names = router_names()
    for name in ("prfaas-threshold", "all-pd", "all-prfaas", "cache-aware",
                 "cache-aware+controller", "prfaas-threshold+controller", "load-balance",
                 "local-cache-aware", "global-cache-aware"):
        assert name in names
    with pytest.raises(UnknownNameError):
        make_router("nope")


def test_unknown_policy_keys_are_rejected_not_ignored() -> None:
    """A typo in a `policy:` section must not silently do nothing."""
    from prfaas.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"policy\.threshhold"):
        make_router("prfaas-threshold", threshold_tokens=10, threshhold=5)
    with pytest.raises(ConfigError, match=r"policy\.scarce_abov"):
        make_router("cache-aware+controller", threshold_tokens=10, scarce_abov=0.9)
    # keys every caller hands every router are accepted by routers that do not use them
    assert make_router("all-pd", threshold_tokens=10, plan_inputs=None).name == "all-pd"
