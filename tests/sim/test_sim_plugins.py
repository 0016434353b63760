"""Simulator plug-in points (hooks) and the load index behind candidate_limit."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from prfaas.core.types import RouteDecision
from prfaas.scenario import Scenario
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.load_index import LoadIndex
from prfaas.sim.plugin import Placement, SimPlugin
from prfaas.sim.run import simulate
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import Workload, synthetic


class Recorder(SimPlugin):
    """Claims 1,000 cached tokens everywhere and makes request 1 wait for a link move."""

    def __init__(self, move_bytes: float) -> None:
        self.move_bytes = move_bytes
        self.routed: list[int] = []
        self.prefilled: list[int] = []
        self.decode_calls = 0
        self.sim: Simulator | None = None

    def attach(self, sim: Simulator) -> None:
        self.sim = sim

    def cached_tokens(self, req: int) -> Mapping[str, int]:
        assert self.sim is not None
        return {p.instance_id: 1000 for p in self.sim.prefills}

    def on_routed(self, req: int, decision: RouteDecision, prefill: PrefillInstance,
                  cached: Mapping[str, int]) -> Placement | None:
        self.routed.append(req)
        if req != 1:
            return None  # the simulator's default placement
        return Placement(2.0, 1e6, link_wait_bytes=self.move_bytes)

    def on_prefill_done(self, req: int, prefill: PrefillInstance) -> None:
        self.prefilled.append(req)

    def on_decode_done(self, decoder: DecodeInstance) -> None:
        self.decode_calls += 1


def test_hooks_are_called_and_a_link_wait_delays_the_prefill(scenario: Scenario) -> None:
    cfg = build_system(scenario, "homogeneous_pd", n_p=9, n_d=3)
    w = Workload(np.array([0.0, 0.0]), np.array([4096, 4096]), np.array([8, 8]), "two")
    rec = Recorder(move_bytes=2.5e9)  # 20 Gbit over a 100 Gbps link: 0.2 s
    sim = Simulator(cfg, w, plugins=[rec]).run()
    assert rec.routed == [0, 1] and sorted(rec.prefilled) == [0, 1] and rec.decode_calls >= 1
    profile = cfg.pd_prefill
    assert profile is not None
    # request 0: default placement, charged for the 3,096 uncached tokens only
    assert sim.log.prefill_end_s[0] == pytest.approx(profile.seconds(4096, 1000))
    # request 1: queued only once 2.5e9 bytes crossed the link, then the plugin's 2 s
    wait_s = 2.5e9 / (100 * BYTES_PER_GBPS)
    assert sim.log.prefill_start_s[1] == pytest.approx(wait_s)
    assert sim.log.prefill_end_s[1] == pytest.approx(wait_s + 2.0)
    assert sim.log.kv_bytes[1] == 1e6


def test_call_at_runs_in_time_order_and_does_not_stretch_the_run(scenario: Scenario) -> None:
    cfg = build_system(scenario, "prfaas_pd")
    w = Workload(np.array([0.0]), np.array([2048]), np.array([4]), "one")
    seen: list[float] = []

    class Timer(SimPlugin):
        def attach(self, sim: Simulator) -> None:
            def note() -> None:
                seen.append(sim.now_s)

            for t in (50.0, 0.5, 3.0):
                sim.call_at(t, note)

    sim = Simulator(cfg, w, plugins=[Timer()]).run()
    assert seen == [0.5, 3.0, 50.0]
    assert sim.now_s == pytest.approx(sim.log.finish_s[0])


def test_load_index_matches_a_sorted_scan() -> None:
    rng = np.random.default_rng(3)
    index = LoadIndex()
    keys: dict[str, tuple[float, str]] = {}
    for step in range(3000):
        member = f"m{int(rng.integers(0, 40)):02d}"
        if rng.random() < 0.05 and member in keys:
            index.remove(member)
            del keys[member]
        else:
            keys[member] = (float(rng.integers(0, 10)), member)  # ties break by id
            index.set(member, keys[member])
        if step % 7 == 0:
            want = [m for _, m in sorted((k, m) for m, k in keys.items())[:8]]
            assert index.smallest(8) == want
    assert len(index._heap) <= 4 * len(keys) + 65  # stale entries are compacted


def test_candidate_limit_changes_no_decision_for_one_hardware_pools(scenario: Scenario) -> None:
    w = synthetic(scenario.lengths, 1024, make_arrivals("poisson"), 3.0, 1500, seed=2)
    cfg = build_system(scenario, "prfaas_pd")
    _, full = simulate(cfg, w)
    _, limited = simulate(cfg, w, candidate_limit=2)
    for out in (full, limited):
        out.pop("sim_wall_s")
    assert limited == full
