"""Scheduled outages: instances and the link go down and up, in-flight work re-runs locally,
before/during/after windows, bad --outage input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from prfaas.cli import main
from prfaas.core.errors import ConfigError
from prfaas.policy.rebalancer import RebalancerConfig
from prfaas.scenario import Scenario
from prfaas.sim.link import LinkSchedule, SharedLink
from prfaas.sim.outages import Outage, parse_outage
from prfaas.sim.policy_run import run_policy
from prfaas.sim.run import simulate
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import Workload, synthetic


@pytest.fixture(scope="module")
def work(scenario: Scenario) -> Workload:
    return synthetic(scenario.lengths, scenario.output_tokens, make_arrivals("uniform"), 2.0,
                     1600, seed=1)


def run(cfg: SystemConfig, work: Workload, *specs: str) -> tuple[Simulator, dict[str, Any]]:
    return simulate(cfg, work, outages=[parse_outage(s) for s in specs])


def windows(summary: dict[str, Any], k: int = 0) -> dict[str, Any]:
    return summary["outages"][k]["windows"]


def assert_accounted(sim: Simulator, summary: dict[str, Any]) -> None:
    """Every request completed, was rejected at arrival or is counted lost; nothing left."""
    assert summary["completed"] + summary["rejected"] + summary["lost"] == summary["requests"]
    assert sim.in_system == 0
    assert all(not d.inflight and not d.waiting and not d.batch for d in sim.decoders)
    assert all(p.running < 0 and not len(p) and not p.held for p in sim.prefills)


def test_parse_outage_and_its_errors() -> None:
    assert parse_outage("prfaas@600+120") == Outage("prfaas", 600.0, 120.0)
    assert parse_outage("pd-d0001@0.5+2.25").end_s == 2.75
    for bad, why in (("prfaas600+120", "NAME@START"), ("prfaas@600", "NAME@START"),
                     ("prfaas@x+1", "numbers"), ("prfaas@600+-5", "DURATION must be"),
                     ("prfaas@600+0", "DURATION must be"), ("prfaas@-1+5", "START must be"),
                     ("@1+2", "NAME@START")):
        with pytest.raises(ConfigError, match=why):
            parse_outage(bad)


@pytest.mark.parametrize("argv,why", [
    (["--outage", "nowhere@10+5"], "names no instance"),
    (["--outage", "prfaas@10+-5"], "DURATION must be positive"),
    (["--outage", "prfaas-10-5"], "expected NAME@START+DURATION"),
    (["--outage", "prfaas@10+5", "--rebalance"], "cannot be combined with --rebalance"),
])
def test_bad_outage_is_one_line_and_exit_2(argv: list[str], why: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--requests", "50", "--json", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and "Traceback" not in err


def test_prfaas_outage_goes_local_reruns_in_flight_and_recovers(
        cfg: SystemConfig, work: Workload) -> None:
    sim, s = run(cfg, work, "prfaas@300+100")
    assert_accounted(sim, s)
    assert s["lost"] == 0 and s["rejected"] == 0 and s["rerun_requests"] >= 1
    w = windows(s)
    assert w["during"]["local_share"] == 1.0  # the same router, PrfaaS gone from its view
    assert w["before"]["local_share"] < 0.7 and w["after"]["local_share"] < 0.7  # back in use
    assert w["during"]["ttft_s"]["mean"] > 2 * w["before"]["ttft_s"]["mean"]
    assert w["during"]["throughput_rps"] < w["before"]["throughput_rps"]
    assert s["outages"][0]["instances"] == [f"prfaas-p{i:04d}" for i in range(cfg.n_prfaas)]
    rerun = [r for r in sim.failover.reruns if sim.log.arrival_s[r] < 300]
    assert rerun and all(not sim.log.remote[r] for r in rerun)  # re-prefilled locally
    again = run(cfg, work, "prfaas@300+100")[1]
    assert again == {**s, "sim_wall_s": again["sim_wall_s"]}  # deterministic


def test_link_outage_routes_local_and_drops_the_transfers(cfg: SystemConfig,
                                                          work: Workload) -> None:
    sim, s = run(cfg, work, "link@300+50")
    assert_accounted(sim, s)
    assert s["lost"] == 0 and s["outages"][0]["instances"] == []
    w = windows(s)
    assert w["during"]["local_share"] == 1.0 and w["after"]["local_share"] < 0.7
    log = sim.log
    during = [i for i, a in enumerate(log.arrival_s) if 300 <= a < 350]
    assert during and not any(log.remote[i] for i in during)
    cut = [r for r in sim.failover.reruns if log.arrival_s[r] < 300]
    assert cut and all(log.kv_ready_s[r] > 300 for r in cut)  # their KV never crossed


def test_decoder_outage_resumes_sequences_without_changing_their_ttft(
        cfg: SystemConfig, work: Workload) -> None:
    base, _ = run(cfg, work)
    sim, s = run(cfg, work, "pd-d0001@400+200")
    assert_accounted(sim, s)
    assert s["lost"] == 0
    resumed = sorted(sim.resume_steps)
    assert resumed  # sequences that were decoding on pd-d0001 at 400 s
    for r in resumed:
        assert sim.log.kv_ready_s[r] == base.log.kv_ready_s[r]  # first token as seen
        assert sim.log.finish_s[r] > base.log.finish_s[r]  # re-prefill + the steps left
        assert 1 <= sim.resume_steps[r] < sim.log.output_tokens[r]
    assert "pd-d0001" not in {i.instance_id for i in sim.view.instances(None, "decode")} or \
        sim.now_s >= 600


def test_everything_down_rejects_with_no_path_and_counts_lost(cfg: SystemConfig,
                                                              work: Workload) -> None:
    sim, s = run(cfg, work, "pd-d@300+20")
    assert_accounted(sim, s)
    w = windows(s)
    assert w["during"]["rejected"] == w["during"]["arrived"] > 0  # 503s: no decoder up
    assert s["lost"] > 0  # sequences on the decoders with nowhere to resume
    assert w["after"]["rejected"] == 0


def test_overlapping_outages_and_an_outage_after_the_end(cfg: SystemConfig,
                                                         work: Workload) -> None:
    sim, s = run(cfg, work, "prfaas-p0001@200+300", "prfaas@300+100", "link@350+10",
                 "pd-p@5000+10")
    assert_accounted(sim, s)
    assert s["lost"] == 0 and len(s["outages"]) == 4
    assert windows(s, 1)["during"]["local_share"] == 1.0
    assert windows(s, 3)["during"]["arrived"] == 0
    assert {i.instance_id for i in sim.view.instances(None, "prefill")} == {
        *(f"prfaas-p{i:04d}" for i in range(cfg.n_prfaas)),
        *(f"pd-p{i:04d}" for i in range(cfg.n_p))}  # all back


def test_cache_aware_controller_through_an_outage(scenario: Scenario, work: Workload) -> None:
    sim, s = run_policy(scenario, "prfaas_pd", "cache-aware+controller", work,
                        outages=[parse_outage("prfaas@300+100")])
    assert_accounted(sim, s)
    assert windows(s)["during"]["local_share"] == 1.0 and s["lost"] == 0
    with pytest.raises(ConfigError, match="rebalance"):
        run_policy(scenario, "prfaas_pd", None, work, outages=[parse_outage("link@1+1")],
                   rebalance=RebalancerConfig())


def test_shared_link_cancel() -> None:
    link = SharedLink(LinkSchedule.constant(8.0))  # 1e9 bytes/s
    link.start(0.0, 1, 1e9)
    link.start(0.0, 2, 1e9)
    assert link.cancel(0.5, {2, 7}) == 1 and link.active == 1
    assert math.isclose(link.next_finish_s() or 0.0, 1.25)  # 0.75e9 left, alone at 1e9 B/s
    assert link.cancel(0.6, {9}) == 0
    assert np.isclose(link.bytes_sent, 0.5e9 + 0.1e9)
