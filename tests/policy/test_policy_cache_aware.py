"""cache-aware: the two regimes, the hysteresis switch, cache-affine nodes, prefix moves."""

from policy_fakes import FakeView, query

from prfaas.core.types import LinkStatus, Route
from prfaas.policy.base import make_router
from prfaas.policy.cache_aware import CacheAwareRouter, RegimeConfig, RegimeSwitch

T = 10_000


def test_no_cache_routes_by_length_against_t() -> None:
    router = CacheAwareRouter(T)
    view = FakeView()
    long, short = router.route(query(T + 1), view), router.route(query(T), view)
    assert long.route is Route.PRFAAS and long.prefill_instance.startswith("prf")
    assert short.route is Route.PD and short.prefill_instance.startswith("pd-p")
    assert long.threshold_tokens == T and long.decode_instance == "pd-d0"  # most free slots
    assert long.prefix_source is None and long.uncached_tokens == T + 1


def test_abundant_moves_the_longer_remote_prefix_and_prefills_locally() -> None:
    d = CacheAwareRouter(T).route(query(30_000, {"prf-1": 28_000}), FakeView())
    assert d.reason == "abundant"
    assert d.route is Route.PD  # 30000 - max(28000, 0) <= t
    assert d.prefix_source == "prf-1" and d.prefix_transfer_tokens == 28_000
    assert d.cached_tokens == 28_000 and d.uncached_tokens == 2_000


def test_abundant_moves_only_what_the_node_lacks() -> None:
    d = CacheAwareRouter(T).route(query(30_000, {"prf-0": 28_000, "pd-p1": 20_000}),
                                  FakeView())
    assert d.prefill_instance == "pd-p1" and d.prefix_source == "prf-0"
    assert d.prefix_transfer_tokens == 8_000 and d.cached_tokens == 28_000


def test_scarce_uses_each_clusters_own_cache_and_moves_nothing() -> None:
    view = FakeView(link_status=LinkStatus(100.0, egress_gbps=80.0))
    d = CacheAwareRouter(T).route(query(30_000, {"prf-1": 28_000}), view)
    assert d.reason == "scarce"
    assert d.route is Route.PRFAAS  # 30000 - l_pd(0) > t
    assert d.prefill_instance == "prf-1" and d.cached_tokens == 28_000  # cache-affine node
    assert d.prefix_source is None and d.prefix_transfer_tokens == 0


def test_regime_switch_has_hysteresis_and_backlog_counts_as_scarce() -> None:
    sw = RegimeSwitch(RegimeConfig(scarce_above=0.7, abundant_below=0.5))
    seq = [0.6, 0.75, 0.6, 0.55, 0.45, 0.65, 0.71]
    states = [sw.update(LinkStatus(100.0, egress_gbps=100 * u)) for u in seq]
    assert states == [False, True, True, True, False, False, True]
    assert sw.switches == 3
    sw2 = RegimeSwitch(RegimeConfig(scarce_backlog_s=1.0))
    # 2 s of backlog at 10 Gbps although the measured egress is low
    assert sw2.update(LinkStatus(10.0, egress_gbps=1.0, pending_bytes=2 * 10e9 / 8))


def test_cache_affine_node_unless_its_queue_outweighs_the_cache() -> None:
    router, view = CacheAwareRouter(T), FakeView()
    d = router.route(query(8_000, {"pd-p1": 5_000}), view)
    assert d.prefill_instance == "pd-p1" and d.cached_tokens == 5_000
    view.set_queue("pd-p1", 100.0)
    d = router.route(query(8_000, {"pd-p1": 5_000}), view)
    assert d.prefill_instance == "pd-p0" and d.cached_tokens == 0


def test_prefix_is_recomputed_when_moving_it_is_slower() -> None:
    view = FakeView(link_status=LinkStatus(0.05))  # abundant (idle) but tiny link
    d = CacheAwareRouter(T).route(query(30_000, {"prf-1": 28_000}), view)
    assert d.route is Route.PD and d.prefix_source is None and d.cached_tokens == 0
    d2 = CacheAwareRouter(T, check_transfer_gain=False).route(
        query(30_000, {"prf-1": 28_000}), view)
    assert d2.prefix_source == "prf-1"


def test_full_cache_still_computes_one_token_and_registry_builds_it() -> None:
    router = make_router("cache-aware", threshold_tokens=T)
    d = router.route(query(4_096, {"pd-p0": 4_096}), FakeView())
    assert d.cached_tokens == 4_095 and d.uncached_tokens == 1
