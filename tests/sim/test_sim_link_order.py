"""The inter-cluster link's two transfer orders against hand-computed times: processor sharing
(`SharedLink`, the native worker) and one transfer at a time (`FifoLink`, the vLLM connector's
one ordered queue per destination). Each FIFO figure is checked beside the shared one it must
differ from (the negative control: a FIFO link that shared would fail these)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.scenario import Scenario, parse_scenario
from prfaas.sim.link import FifoLink, LinkSchedule, SharedLink, make_link
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.requests import Workload

GBPS_8 = LinkSchedule.constant(8.0)  # 1e9 bytes/s


def _finish_times(link: SharedLink | FifoLink) -> dict[int, float]:
    """Run the link to empty: each flow's finish time."""
    done: dict[int, float] = {}
    while (at := link.next_finish_s()) is not None:
        for flow in link.pop_finished(at):
            done[flow] = at
    return done


def test_fifo_sends_one_transfer_at_a_time_in_start_order() -> None:
    fifo, shared = FifoLink(GBPS_8), SharedLink(GBPS_8)
    for link in (fifo, shared):
        link.start(0.0, 1, 3e9)  # a long transfer first
        link.start(0.5, 2, 1e9)  # a short one half a second later
    assert _finish_times(fifo) == pytest.approx({1: 3.0, 2: 4.0})
    # processor sharing: from 0.5 s each gets 0.5e9 B/s, so the short one overtakes
    assert _finish_times(shared) == pytest.approx({2: 2.5, 1: 4.0})


def test_fifo_is_work_conserving_across_a_late_event() -> None:
    link = FifoLink(GBPS_8)
    link.start(0.0, 1, 1e9)
    link.start(0.0, 2, 1e9)
    assert link.pop_finished(1.5) == [1]  # processed late: flow 2 already got 0.5 s of it
    assert link.next_finish_s() == pytest.approx(2.0)
    assert link.pop_finished(2.0) == [2]
    assert link.bytes_sent == pytest.approx(2e9) and link.busy_s == pytest.approx(2.0)
    assert link.next_finish_s() is None and link.egress_bps() == 0.0


def test_fifo_follows_a_capacity_change_and_the_flow_cap() -> None:
    link = FifoLink(LinkSchedule.piecewise([(0.0, 8.0), (1.0, 16.0)]))
    link.start(0.0, 1, 2e9)
    link.set_capacity(1.0, 16.0)  # 1e9 left at 2e9 B/s
    assert link.next_finish_s() == pytest.approx(1.5)
    capped = FifoLink(GBPS_8, flow_cap_gbps=4.0)
    capped.start(0.0, 1, 1e9)
    assert capped.next_finish_s() == pytest.approx(2.0)
    assert capped.egress_bps() == pytest.approx(0.5e9)


def test_fifo_cancel_lets_the_next_transfer_go_and_empty_flows_finish_at_once() -> None:
    link = FifoLink(GBPS_8)
    link.start(0.0, 1, 4e9)
    link.start(0.0, 2, 0.0)
    link.start(0.0, 3, 1e9)
    assert link.cancel(1.0, {1, 99}) == 1  # flow 1 dropped with 3e9 unsent
    assert link.pop_finished(1.0) == [2]  # the empty transfer is done when it reaches the head
    assert link.next_finish_s() == pytest.approx(2.0)
    assert link.active == 1 and link.egress_bps() == pytest.approx(1e9)


def test_both_orders_carry_the_same_bytes_by_the_same_time() -> None:
    """Work conservation: the last flow ends when all the bytes could have crossed, whatever
    the order (random sizes and starts)."""
    rng = np.random.default_rng(7)
    sizes, starts = rng.uniform(1e8, 2e9, 12), np.sort(rng.uniform(0.0, 5.0, 12))
    ends = []
    for link in (FifoLink(GBPS_8), SharedLink(GBPS_8)):
        done: dict[int, float] = {}
        for i, (size, start) in enumerate(zip(sizes, starts, strict=True)):
            while (at := link.next_finish_s()) is not None and at <= start:
                done.update(dict.fromkeys(link.pop_finished(at), at))
            link.start(float(start), i, float(size))
        done.update(_finish_times(link))
        assert sorted(done) == list(range(12))
        ends.append(max(done.values()))
    assert ends[0] == pytest.approx(ends[1], rel=1e-9)


def test_make_link_picks_by_name_and_refuses_another() -> None:
    assert isinstance(make_link(GBPS_8), SharedLink)
    assert isinstance(make_link(GBPS_8, order="fifo"), FifoLink)
    with pytest.raises(ConfigError, match=r"link\.order.*fifo"):
        make_link(GBPS_8, order="lifo")
    with pytest.raises(ConfigError, match="per_connection_gbps"):
        FifoLink(GBPS_8, flow_cap_gbps=0.0)


def _two_offloads(scenario: Scenario, order: str) -> np.ndarray:
    cfg = replace(build_system(scenario, "prfaas_pd", threshold_tokens=1000,
                               link=LinkSchedule.constant(0.05)), link_order=order)
    w = Workload(np.array([0.0, 0.0]), np.array([32768, 32768]), np.array([16, 16]), "two")
    sim, _ = simulate(cfg, w)
    assert all(sim.log.remote)
    return np.sort(np.asarray(sim.log.kv_ready_s, dtype=float))


def test_the_simulator_runs_transfers_in_the_configured_order(scenario: Scenario) -> None:
    """Two offloads on a slow link: shared, both transfers stretch to the end; FIFO, the first
    crosses at the full rate and ends well before the second."""
    fifo, shared = _two_offloads(scenario, "fifo"), _two_offloads(scenario, "shared")
    assert fifo[1] == pytest.approx(shared[1], rel=1e-6)  # the link's work ends together
    assert fifo[0] < 0.75 * shared[0]  # FIFO: one transfer done long before the other


def test_scenario_link_order_is_read_and_a_wrong_one_refused(scenario: Scenario) -> None:
    link = scenario.raw["link"]
    fifo = parse_scenario({**scenario.raw, "link": {**link, "order": "fifo"}})
    assert fifo.link_order == "fifo" and scenario.link_order == "shared"
    cfg = build_system(fifo, "prfaas_pd")
    assert cfg.link_order == "fifo" and cfg.describe()["link_order"] == "fifo"
    with pytest.raises(ConfigError, match=r"link\.order"):
        parse_scenario({**scenario.raw, "link": {**link, "order": "priority"}})
    with pytest.raises(ConfigError, match=r"link\.order"):
        build_system(scenario, "prfaas_pd", link_order="lifo")
