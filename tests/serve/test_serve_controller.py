"""Live: the threshold controller in the router (`cache-aware+controller` on the local topology).

The controller re-solves t from the measured profile (data/profiles/cpu-tiny.yaml), the
topology's link and its window of uncached lengths. With a window of 6 and a short period, the
t a request reports is, at known points, the planner's Eq. 7 solution for the previous 6
requests: after a long-heavy batch A and after a short-heavy batch B. Every request must route
by the t it reports (distinct random prompts: no prefix hits, uncached = prompt tokens).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

import pytest
from serve_helpers import complete, get_text

from prfaas.planner.search import PlanInputs
from prfaas.policy.controller import ControllerConfig, solve_threshold
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.router.plan import live_plan_inputs
from prfaas.serve.topology import Topology, load_topology
from prfaas.workload.lengths import empirical

pytestmark = pytest.mark.timeout(600)

INITIAL_T = 1024
CONTROLLER = {"period_s": 0.5, "window_requests": 6, "min_window": 6, "agree_solves": 1,
              "min_rel_change": 0.0}
LONG_BATCH = (100, 200, 400, 700, 1200, 1600)  # prompt tokens, BOS included
SHORT_BATCH = (60, 90, 130, 200, 260, 350)


def _topology() -> Topology:
    topo = load_topology()  # the embedded local topology: 1 PrfaaS, 1 PD-P, 1 PD-D
    return replace(topo, router_port=0, policy="cache-aware+controller",
                   policy_args={"threshold_tokens": INITIAL_T, "controller": CONTROLLER},
                   workers=tuple(replace(w, port=0, kv_port=0) for w in topo.workers))


def _prompt(tokens: int, rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens - 1))


def _planner_t(inputs: PlanInputs, lengths: tuple[int, ...], link_gbps: float) -> int:
    cfg = ControllerConfig(**CONTROLLER)  # type: ignore[arg-type]
    solved = replace(inputs, lengths=empirical(list(lengths)),
                     link_gbps=link_gbps * cfg.link_headroom)
    return solve_threshold(solved, n_prfaas=1, n_p=1, mode=cfg.mode)


def _send(url: str, lengths: tuple[int, ...], rng: random.Random) -> list[dict[str, Any]]:
    replies = []
    for n in lengths:
        reply = complete(url, _prompt(n, rng), max_tokens=2)
        assert reply["usage"]["prompt_tokens"] == n
        replies.append(reply)
    return replies


def test_controller_moves_t_to_the_planners_solution_and_routes_by_it() -> None:
    topo = _topology()
    inputs = live_plan_inputs(topo)
    assert (inputs.n_prfaas, inputs.n_pd) == (1, 2)
    rate = topo.link.rate_gbps
    assert rate is not None
    t_long, t_short = _planner_t(inputs, LONG_BATCH, rate), _planner_t(inputs, SHORT_BATCH, rate)
    assert len({t_long, t_short, INITIAL_T}) == 3  # otherwise the test could not tell them apart
    probe_tokens = t_short + 100  # offloaded only under t_short
    assert probe_tokens <= min(t_long, INITIAL_T)
    rng = random.Random(7)
    with Deployment(topo) as dep:
        first = _send(dep.url, LONG_BATCH, rng)
        time.sleep(CONTROLLER["period_s"] + 0.1)
        second = _send(dep.url, SHORT_BATCH, rng)
        time.sleep(CONTROLLER["period_s"] + 0.1)
        probe = _send(dep.url, (probe_tokens,), rng)
        metrics = get_text(f"{dep.url}/metrics")
    replies = first + second + probe
    for r in replies:  # routed by the t it reports, with no prefix hit
        p = r["prfaas"]
        assert p["cached_tokens"] == 0
        expected = "prfaas" if r["usage"]["prompt_tokens"] > p["threshold_tokens"] else "pd"
        assert p["route"] == expected, (r["usage"], p["threshold_tokens"], p["route"])
    ts = [r["prfaas"]["threshold_tokens"] for r in replies]
    assert ts[:6] == [INITIAL_T] * 6  # no solve before the window holds 6 lengths
    assert ts[6] == t_long  # solved on batch A when B's first request arrived
    assert ts[-1] == t_short  # solved on batch B when the probe arrived
    assert {r["prfaas"]["route"] for r in first} == {"pd", "prfaas"}
    assert probe[0]["prfaas"]["route"] == "prfaas"
    assert f"prfaas_threshold_tokens {float(t_short)}" in metrics
    assert 'prfaas_kv_bytes_total{link="inter_dc"}' in metrics
