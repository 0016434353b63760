"""Role rebalancing in the simulator: a bad PD split moves to the planner's optimum."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prfaas.planner.search import plan_all
from prfaas.policy.rebalancer import RebalancerConfig
from prfaas.scenario import Scenario
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic


def off_and_on(s: Scenario, n_p: int, n_d: int, rate: float, n: int
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    w = synthetic(s.lengths, s.output_tokens, make_arrivals("uniform"), rate, n, seed=0)
    cfg = build_system(s, "prfaas_pd", n_p=n_p, n_d=n_d)
    _, off = simulate(cfg, w)
    _, on = simulate(cfg, w, rebalance=RebalancerConfig())
    return off, on


def test_decode_bound_split_moves_to_the_planner_optimum(scenario: Scenario) -> None:
    plan = plan_all(scenario, mode="exact").systems["prfaas_pd"]
    assert (plan.n_p, plan.n_d) == (3, 5)
    # 6 PD-P / 2 PD-D: decode carries ~1.56 req/s; the optimum split sustains 3.24 req/s
    off, on = off_and_on(scenario, 6, 2, 2.8, 5040)  # 30 simulated minutes
    assert on["final_split"] == {"n_p": plan.n_p, "n_d": plan.n_d}
    changes = on["role_changes"]
    assert len(changes) == 3  # one instance at a time, no flip-flop at the optimum
    assert all(c["from_role"] == "prefill" and c["to_role"] == "decode" for c in changes)
    assert all(c["ready_s"] == pytest.approx(c["drained_s"] + 5.0) for c in changes)
    assert all(c["drained_s"] >= c["time_s"] for c in changes)
    assert off["throughput_rps"] < 1.7 and off["queue"]["growth"] > 100  # decode-starved
    assert on["throughput_rps"] > 0.98 * 2.8 and on["queue"]["growth"] < 10
    assert on["e2e_s"]["mean"] < off["e2e_s"]["mean"] / 10
    assert on["tpot_s"]["p90"] < off["tpot_s"]["p90"] / 10


def test_prefill_bound_split_cuts_ttft(scenario: Scenario) -> None:
    # 1 PD-P / 7 PD-D: the short requests queue at one H20 prefill
    off, on = off_and_on(scenario, 1, 7, 2.4, 3600)
    changes = on["role_changes"]
    # two moves, the second decided while the first drains (the draining decoder still waits
    # for KV of requests queued at the overloaded PD-P); it counts in its new role, so no
    # third move overshoots to 4/4
    assert [c["to_role"] for c in changes] == ["prefill", "prefill"]
    assert on["final_split"] == {"n_p": 3, "n_d": 5}
    assert on["throughput_rps"] > 1.3 * off["throughput_rps"]
    assert on["ttft_s"]["mean"] < off["ttft_s"]["mean"] / 10
    assert on["ttft_s"]["p90"] < off["ttft_s"]["p90"] / 10


def test_optimum_split_is_left_alone_and_off_adds_no_keys(scenario: Scenario) -> None:
    off, on = off_and_on(scenario, 3, 5, 2.8, 2520)
    assert on["role_changes"] == [] and on["final_split"] == {"n_p": 3, "n_d": 5}
    assert "role_changes" not in off
    same = {k: v for k, v in on.items() if k not in ("role_changes", "final_split",
                                                      "sim_wall_s", "events")}
    assert json.dumps(same, sort_keys=True) == json.dumps(
        {k: v for k, v in off.items() if k not in ("sim_wall_s", "events")}, sort_keys=True)
