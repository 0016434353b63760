"""The live outage beside the simulated one (prfaas.experiments.outage), on the tiny scenario:
the link is partitioned mid-run; no request is lost, the PD cluster takes the load while it is
down, and both sides report the same windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_scenario import write_scenario

from needs import needs
from prfaas.emulated.scales import Scales
from prfaas.experiments.outage import outage_live, windows
from prfaas.experiments.probe import judge
from prfaas.experiments.runs import RunRecord
from prfaas.sim.outages import Outage, parse_outage

pytestmark = pytest.mark.timeout(400)


def test_windows_split_arrivals_and_convert_to_scenario_units() -> None:
    a = 0.5  # live s = scenario s x a
    arrival = np.array([1.0, 4.0, 6.0, 9.0, 12.0]) * a
    ready = arrival + np.array([1.0, 2.0, 3.0, 4.0, 5.0]) * a
    finish = ready + 1.0
    finish[3] = np.nan  # not completed
    remote = np.array([True, True, False, False, True])
    rec = RunRecord(judge(1.0, arrival, ready, finish), arrival, ready, finish, remote, 0.0,
                    10.0)
    w = windows(rec, Outage("link", 5.0, 5.0), a)
    assert [w[k]["arrived"] for k in ("before", "during", "after")] == [2, 2, 1]
    assert w["before"]["ttft_s"]["mean"] == 1.5 and w["during"]["ttft_s"]["p50"] == 3.5
    assert w["during"]["local_share"] == 1.0 and w["before"]["local_share"] == 0.0
    assert w["during"]["not_completed"] == 1 and w["after"]["not_completed"] == 0
    # first tokens in [5, 10): the ones ready at 6+2 = 8 s (scenario); 4+2 = 6 s; 9+4 = 13 no
    assert w["during"]["first_tokens_per_s"] == pytest.approx(2 / 5)


@needs("netns")
def test_a_live_link_outage_loses_nothing_and_goes_local(tmp_path: Path) -> None:
    scales = Scales(time=0.5, bytes=1e-2, tokens=4, output=4)
    result = outage_live(parse_outage("link@24+12"), scales, load=0.5,
                         scenario=str(write_scenario(tmp_path)))
    sim = result["sim"]["windows"]
    for run in result["live"].values():
        assert run["lost"] == 0, run["error_samples"]  # shed (429) is allowed in `default`
    assert result["live"]["as_simulated"]["shed"] == 0  # no admission limit: all accepted
    live = result["live"]["as_simulated"]["windows"]
    for name in ("before", "during", "after"):
        assert live[name]["arrived"] > 5 and live[name]["not_completed"] == 0
        assert live[name]["arrived"] == sim[name]["arrived"]  # the same workload
    assert sim["during"]["local_share"] == 1.0  # the simulator's link is down exactly then
    # live, the router learns of the partition from failed checks: most, not all, go local
    assert live["during"]["local_share"] > max(live["before"]["local_share"], 0.5)
    assert live["after"]["local_share"] < live["during"]["local_share"]  # PrfaaS used again
    lo, hi = result["live"]["as_simulated"]["partition_window_live_s"]
    assert hi - lo == pytest.approx(12 * 0.5, abs=1.0)


def test_fluctuation_counts_what_the_policy_offered_the_link_failures_included() -> None:
    """A request sent to PrfaaS whose transfer failed and was retried locally was still offered
    to the link: the dip's offered egress counts it (first_route), the offload share does not."""
    from prfaas.experiments.fluctuation import _figures

    sc = Scales(time=0.5, bytes=1e-2, tokens=4, output=4)
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    ready = arrival + 0.5
    finish = ready + 1.0
    remote = np.array([True, False, False, True])  # request 1 was retried locally
    offered = np.array([True, True, False, True])
    rec = RunRecord(judge(1.0, arrival, ready, finish), arrival, ready, finish, remote, 0.0,
                    4.0, offered=offered)
    kv = np.array([1e6, 2e6, 4e6, 8e6])
    # the link's byte counter (live s, cumulative bytes): request 1's failed transfer put only
    # 1.5 MB of its 2 MB on the wire during the dip, so what was carried is not what was offered
    samples = [(0.0, 0.0), (0.5, 1e6), (2.5, 2.5e6), (4.0, 10.5e6)]
    fig = _figures(rec, 0.5, 2.5, sc, kv, samples)  # the dip holds arrivals 1 and 2
    assert fig["dip_offered_egress_gbps"] == pytest.approx(2e6 * 8 / 2.0 / 1e9 * 0.5 / 1e-2,
                                                           rel=1e-3)
    assert fig["dip_carried_gbps"] == pytest.approx(1.5e6 * 8 / 2.0 / 1e9 * 0.5 / 1e-2, rel=1e-3)
    assert fig["dip_offload_fraction"] == 0.0 and fig["dip_offered_fraction"] == 0.5
