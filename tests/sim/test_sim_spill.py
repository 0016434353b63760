"""The simulator's bounded prefill queues (`max_queued_per_prefill`, policy/spill.py, the live
dispatcher's object): requests spill to the other route or are refused, and nothing changes
without the limit. Also: sim/failover.py reaches no private member of the simulator."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prfaas.cli import main
from prfaas.scenario import Scenario
from prfaas.sim import failover
from prfaas.sim.outages import parse_outage
from prfaas.sim.run import simulate
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import Workload, synthetic

LIMIT = 4


@pytest.fixture(scope="module")
def work(scenario: Scenario) -> Workload:
    # above the planner's capacity: queues build up
    return synthetic(scenario.lengths, scenario.output_tokens, make_arrivals("poisson"), 3.0,
                     1500, seed=2)


def most_waiting(sim: Simulator, remote: bool) -> int:
    """From the request log alone: the most requests of one pool (PrfaaS or PD-P) between
    arrival and first token (KV at the decoder) that any admitted request saw, itself
    included. Ties: KV arrivals are handled before the arrivals of the same instant."""
    log = sim.log
    arrival, ready = np.asarray(log.arrival_s), np.asarray(log.kv_ready_s)
    mine = ~np.asarray(log.rejected) & (np.asarray(log.remote) == remote)
    idx = np.flatnonzero(mine)
    return max(int(np.sum((idx <= j) & (ready[idx] > arrival[j]))) for j in idx)


def test_without_the_limit_nothing_spills_and_the_json_is_unchanged(
        cfg: SystemConfig, work: Workload) -> None:
    sim, summary = simulate(cfg, work)
    assert "spilled" not in summary and "queue_full" not in summary
    assert "max_queued_per_prefill" not in summary["config"]
    assert sim.spilled == sim.queue_full == summary["rejected"] == 0
    # the negative control of the bound below: unlimited, the queues do grow past it
    assert most_waiting(sim, True) > LIMIT * cfg.n_prfaas
    assert most_waiting(sim, False) > LIMIT * cfg.n_p
    # a limit that never binds changes no figure
    _, loose = simulate(replace(cfg, max_queued_per_prefill=10**6), work)
    assert (loose.pop("spilled"), loose.pop("queue_full")) == (0, 0)
    assert loose["config"].pop("max_queued_per_prefill") == 10**6
    for key in ("sim_wall_s",):
        loose.pop(key), summary.pop(key)
    assert loose == summary


def test_a_full_queue_spills_to_the_other_route_and_both_full_is_rejected(
        cfg: SystemConfig, work: Workload) -> None:
    _, free = simulate(cfg, work)
    sim, summary = simulate(replace(cfg, max_queued_per_prefill=LIMIT), work)
    assert summary["spilled"] == sim.spilled > 0
    assert summary["queue_full"] == sim.queue_full > 0
    assert summary["rejected"] == summary["queue_full"]  # the only refusals here
    assert summary["completed"] + summary["rejected"] == summary["requests"]
    assert summary["config"]["max_queued_per_prefill"] == LIMIT
    # no admission beyond the limit, read from the log (not the simulator's counter)
    assert most_waiting(sim, True) <= LIMIT * cfg.n_prfaas
    assert most_waiting(sim, False) <= LIMIT * cfg.n_p
    assert not any(sim.awaiting_first_token.values())  # the counter came back to zero
    # bounded queues: the admitted requests' TTFT tail is below the unbounded run's
    assert summary["ttft_s"]["p90"] < free["ttft_s"]["p90"]


def test_spill_with_outages_keeps_the_waiting_counts_balanced(
        cfg: SystemConfig, work: Workload) -> None:
    outages = [parse_outage(s) for s in ("link@100+60", "prfaas-p0000@150+40",
                                         "pd-d0001@200+30", "pd-p0000@220+30")]
    sim, summary = simulate(replace(cfg, max_queued_per_prefill=LIMIT), work, outages=outages)
    assert summary["spilled"] > 0 and summary["rerun_requests"] > 0
    assert summary["completed"] + summary["rejected"] + summary["lost"] == summary["requests"]
    assert sim.in_system == 0
    assert not any(sim.awaiting_first_token.values())


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    import json

    main(["simulate", "--json", "--requests", "400", "--rate", "3", "--arrivals", "poisson",
          *argv])
    return json.loads(capsys.readouterr().out)


def test_cli_knob_on_both_simulate_paths(capsys: pytest.CaptureFixture[str]) -> None:
    plain = run_cli(["--max-queued-per-prefill", "2"], capsys)
    assert plain["spilled"] > 0 and plain["config"]["max_queued_per_prefill"] == 2
    named = run_cli(["--max-queued-per-prefill", "2", "--policy", "prfaas-threshold"], capsys)
    assert named["spilled"] > 0 and named["config"]["max_queued_per_prefill"] == 2
    assert "spilled" not in run_cli([], capsys)


def test_cli_bad_limit_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--json", "--requests", "50", "--max-queued-per-prefill", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "max_queued_per_prefill" in err and "0" in err and len(err.splitlines()) == 1


def test_failover_reaches_no_private_member_of_the_simulator() -> None:
    tree = ast.parse(Path(failover.__file__).read_text())
    private = sorted({node.attr for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and ast.unparse(node.value) in ("sim", "self.sim")})
    assert private == []
    # the check sees such an access (its negative control)
    probe = ast.parse("sim._held.pop(r)")
    assert any(isinstance(n, ast.Attribute) and n.attr == "_held"
               and ast.unparse(n.value) == "sim" for n in ast.walk(probe))
