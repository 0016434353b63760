"""Policies and prefix caches inside the simulator: hits, in-flight gap, prefix moves,
rejections, the controller's t, flags' bad input."""

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.scenario import load_scenario
from prfaas.sim.caching import ideal_prefix_hit_fraction
from prfaas.sim.policy_run import load_link_schedule, parse_capacity, run_policy
from prfaas.workload.requests import Workload


def conversation(n: int = 40, gap_s: float = 2.0, turns: int = 4,
                 new_blocks: tuple[int, ...] = (8,)) -> Workload:
    """n requests: conversations of `turns` turns; turn k reuses the previous turns' blocks
    and adds new_blocks[k % len(new_blocks)] blocks of 512 tokens."""
    arrival, inputs, hashes = [], [], []
    for i in range(n):
        conv, turn = divmod(i, turns)
        size = sum(new_blocks[k % len(new_blocks)] for k in range(turn + 1))
        blocks = tuple(conv * 1000 + b for b in range(size))
        arrival.append(i * gap_s)
        inputs.append(len(blocks) * 512)
        hashes.append(blocks)
    return Workload(np.asarray(arrival, float), np.asarray(inputs, np.int64),
                    np.full(n, 64, np.int64), "toy conversations", tuple(hashes))


@pytest.fixture(scope="module")
def scenario():  # type: ignore[no-untyped-def]
    return load_scenario("mooncake-conversation")


def test_ideal_fraction_counts_every_earlier_full_block() -> None:
    w = conversation(n=4, turns=4)  # one conversation: 8, 16, 24, 32 blocks
    assert ideal_prefix_hit_fraction(w) == pytest.approx((0 + 8 + 16 + 24) / (8 + 16 + 24 + 32))


def test_spaced_requests_reach_the_ideal_and_overlapping_ones_fall_short(scenario) -> None:  # type: ignore[no-untyped-def]
    _, spaced = run_policy(scenario, "prfaas_pd", "prfaas-threshold", conversation(gap_s=30.0),
                           cache_scope="global")
    ideal = spaced["ideal_prefix_hit_fraction"]
    # every hit but the 1-token floor: a fully cached prompt still computes one token
    assert spaced["prefix_hit_fraction"] == pytest.approx(ideal, abs=0.01)
    _, burst = run_policy(scenario, "prfaas_pd", "prfaas-threshold",
                          conversation(gap_s=0.001), cache_scope="global")
    assert burst["prefix_hit_fraction"] < ideal - 0.2  # earlier turns still in flight


def test_cache_aware_moves_prefixes_the_static_rule_recomputes(scenario) -> None:  # type: ignore[no-untyped-def]
    # short turns stay local, long ones go to PrfaaS, whose pool lacks the local turns' blocks
    w = conversation(n=60, gap_s=20.0, turns=6, new_blocks=(2, 16))
    _, static = run_policy(scenario, "prfaas_pd", "prfaas-threshold", w, cache_scope="cluster",
                           threshold_tokens=3_000)
    _, aware = run_policy(scenario, "prfaas_pd", "cache-aware", w, cache_scope="cluster",
                          threshold_tokens=3_000)
    assert static["prefix_moves"] == 0 and aware["prefix_moves"] > 0
    assert aware["prefix_move_gb"] > 0
    assert aware["prefix_hit_fraction"] > static["prefix_hit_fraction"]


def test_slo_rejections_are_counted_and_controller_t_is_reported(scenario) -> None:  # type: ignore[no-untyped-def]
    w = conversation(n=80, gap_s=0.05, turns=2)
    _, out = run_policy(scenario, "prfaas_pd", "cache-aware+controller", w,
                        cache_scope="cluster", ttft_slo_s=1.0,
                        controller={"period_s": 0.5, "min_window": 10})
    assert out["rejected"] > 0
    assert out["completed"] + out["rejected"] == out["requests"]
    assert out["threshold_tokens"]["min"] <= out["threshold_tokens"]["max"]
    assert out["threshold_history"][0][1] == out["config"]["threshold_tokens"]


def test_bad_cache_capacity_and_link_schedule_are_clear_errors(scenario, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert parse_capacity("unlimited") is None and parse_capacity("2G") == 2 * 1024**3
    with pytest.raises(ConfigError, match="cache_capacity"):
        parse_capacity("lots")
    with pytest.raises(ConfigError, match="capacity_bytes"):
        run_policy(scenario, "prfaas_pd", "cache-aware", conversation(), cache_scope="cluster",
                   cache_capacity=1024)  # far smaller than one request
    path = tmp_path / "link.yaml"
    path.write_text("[[0, 100], [30, 10], [60, 100]]\n")
    sched = load_link_schedule(path)
    assert sched.at(45.0) == 10.0 and sched.at(61.0) == 100.0
    path.write_text("[[5, 100]]\n")
    with pytest.raises(ConfigError, match="start at 0"):
        load_link_schedule(path)
