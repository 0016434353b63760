"""`link.release` (models/kv_release.py): when a chunked prefill with recurrent state hands its
KV to the link, against hand-computed bounds; each beside the default layer-by-layer figure it
must differ from (the negative control), and in the simulator on one offload."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.kv_release import KvRelease, parse_release, save_points_of
from prfaas.scenario import Scenario, parse_scenario
from prfaas.sim.link import LinkSchedule
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.requests import Workload


def test_pieces_follow_the_chunks_and_the_state_comes_last() -> None:
    r = KvRelease(chunk_tokens=1024, state_bytes=200_000, save_points=((0.5, 1.0),))
    # 1500 tokens, 100 B per token + the state; prefill from 0 to 3 s (2 ms per token)
    pieces = r.pieces(1500, 350_000, 0.0, 3.0)
    expected = [(3.0 * 512 / 1500, 102_400),  # chunk 1, half-way through it
                (3.0 * (1024 + 238) / 1500, 47_600),  # chunk 2 (476 tokens)
                (3.0, 200_000)]  # the state at prefill end
    assert np.array(pieces) == pytest.approx(np.array(expected))
    assert sum(b for _, b in pieces) == pytest.approx(350_000)


def test_the_state_sent_after_prefill_end_bounds_a_fast_link() -> None:
    r = KvRelease(chunk_tokens=1024, state_bytes=200_000, save_points=((0.5, 1.0),))
    # 1e6 B/s: the chunks are across long before the end; the state takes 0.2 s after it
    assert r.ready_s(1500, 350_000, 0.0, 3.0, 1e6) == pytest.approx(3.2)
    # the layer-by-layer default with 4 layers would leave 350_000 / 4 B: 3.0875 s
    assert pytest.approx(3.0875) == 3.0 + 350_000 / 4 / 1e6


def test_the_first_chunk_bounds_a_slow_link() -> None:
    r = KvRelease(chunk_tokens=1024, state_bytes=0, save_points=((0.5, 1.0),))
    # 50_000 B/s: all 150_000 B follow the first chunk's piece (at 1.024 s): 1.024 + 3.0
    assert r.ready_s(1500, 150_000, 0.0, 3.0, 50_000) == pytest.approx(4.024)
    # streamed from prefill start (the default's bandwidth bound) it would be 3.0 s
    assert pytest.approx(3.0) == 0.0 + 150_000 / 50_000


def test_two_save_points_split_a_chunk_and_the_state_caps_at_the_transfer() -> None:
    r = KvRelease(chunk_tokens=4096, state_bytes=1e9, save_points=((0.25, 0.5), (0.75, 0.5)))
    pieces = r.pieces(100, 50_000, 10.0, 12.0)  # the state is more than the whole transfer
    assert np.array(pieces) == pytest.approx(np.array([(10.5, 0.0), (11.5, 0.0),
                                                       (12.0, 50_000)]))
    assert r.ready_s(100, 50_000, 10.0, 12.0, 1e5) == pytest.approx(12.5)


def test_save_points_of_a_hybrid_model() -> None:
    # 3 GDN : 1 attention (the tiny Qwen3-Next): the attention layer runs last of four
    assert save_points_of(["linear_attention"] * 3 + ["full_attention"]) == ((0.875, 1.0),)
    two = save_points_of(["full_attention", "linear_attention"] * 2)
    assert np.array(two) == pytest.approx(np.array([(0.125, 0.5), (0.625, 0.5)]))
    assert save_points_of(["linear_attention"] * 4) == ((1.0, 1.0),)


@pytest.mark.parametrize("raw,match", [
    ({"chunk_tokens": 0, "state_bytes": 1}, "chunk_tokens"),
    ({"chunk_tokens": 8, "state_bytes": -1}, "state_bytes"),
    ({"chunk_tokens": 8, "save_points": [[0.5, 0.4]]}, "add up to 1"),
    ({"chunk_tokens": 8, "save_points": [[0.0, 1.0]]}, "fraction"),
    ({"chunk_tokens": 8, "chunk": 3}, "unknown keys"),
    ({"state_bytes": 1}, "chunk_tokens"),
    ("chunked", "expected"),
])
def test_a_wrong_release_is_refused_with_its_key(raw: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_release(raw)


def _one_offload(scenario: Scenario, release: dict[str, object] | None):  # type: ignore[no-untyped-def]
    link = {**scenario.raw["link"], **({"release": release} if release else {})}
    s = parse_scenario({**scenario.raw, "link": link})
    cfg = replace(build_system(s, "prfaas_pd", threshold_tokens=1000,
                               link=LinkSchedule.constant(0.05)), link_order="fifo")
    w = Workload(np.array([0.0]), np.array([32768]), np.array([16]), "one")
    sim, _ = simulate(cfg, w)
    assert sim.log.remote[0]
    return cfg, sim.log


def test_the_simulator_holds_the_kv_until_the_release_bound(scenario: Scenario) -> None:
    """One offload alone on a 0.05 Gbps link: with the release model its KV arrives at the
    bound computed here from the log's prefill times; without it, at the layer-by-layer
    figure, which is earlier."""
    state = 2e6
    cfg, log = _one_offload(scenario, {"chunk_tokens": 8192, "state_bytes": state,
                                       "save_points": [[0.5, 1.0]]})
    assert cfg.flow_cap_gbps is None and cfg.kv_release is not None
    rate = 0.05e9 / 8
    start, end, kv = log.prefill_start_s[0], log.prefill_end_s[0], log.kv_bytes[0]
    per_token = (kv - state) / 32768
    bound = end + state / rate  # the state, sent after the last chunk
    done = 0
    for c in (8192,) * 4:  # four chunks of 8192 tokens, each saved half-way through it
        at = start + (end - start) * (done + 0.5 * c) / 32768
        bound = max(bound, at + (kv - per_token * done) / rate)
        done += c
    assert log.kv_ready_s[0] == pytest.approx(bound + cfg.rtt_s, rel=1e-9)
    _, plain = _one_offload(scenario, None)
    layered = max(start + kv / rate, end + kv / cfg.kv_layers / rate) + cfg.rtt_s
    assert plain.kv_ready_s[0] == pytest.approx(layered, rel=1e-9)
    assert plain.kv_ready_s[0] < log.kv_ready_s[0] - 0.1


def test_scenario_reads_the_release_and_the_config_describes_it(scenario: Scenario) -> None:
    link = {**scenario.raw["link"], "release": {"chunk_tokens": 1024, "state_bytes": 5.0}}
    s = parse_scenario({**scenario.raw, "link": link})
    assert s.kv_release == KvRelease(1024, 5.0) and scenario.kv_release is None
    cfg = build_system(s, "prfaas_pd")
    assert cfg.describe()["kv_release"] == {"chunk_tokens": 1024, "state_bytes": 5.0,
                                            "save_points": [[1.0, 1.0]]}
    assert "kv_release" not in build_system(scenario, "prfaas_pd").describe()
