"""Capacity against the planner, the Poisson ordering, and the CLI's bad-input handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.cli import main
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario
from prfaas.sim.capacity import find_capacity
from prfaas.sim.system import SYSTEMS, build_system
from prfaas.workload.arrivals import make_arrivals

SCENARIO = load_scenario("paper-case-study")


def capacity(system: str, arrivals: str) -> float:
    guess = plan_all(SCENARIO, mode="paper").systems[system].lambda_max
    return find_capacity(build_system(SCENARIO, system), SCENARIO.lengths,
                         SCENARIO.output_tokens, make_arrivals(arrivals), requests=3000,
                         seed=0, guess_rps=guess, rel_tol=0.01).max_rps


@pytest.mark.parametrize("system", SYSTEMS)
def test_uniform_capacity_within_3_percent_of_exact_planner(system: str) -> None:
    exact = plan_all(SCENARIO, mode="exact").systems[system].lambda_max
    assert capacity(system, "uniform") == pytest.approx(exact, rel=0.03)


def test_poisson_ordering() -> None:
    got = {s: capacity(s, "poisson") for s in SYSTEMS}
    assert got["prfaas_pd"] > got["naive_heterogeneous"] > got["homogeneous_pd"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as exc:  # main() exits only on errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "message"), [
    (["simulate", "--trace", "/no/such.jsonl"], "no such trace file"),
    (["simulate", "--rate", "0"], "rate=0.0: must be a positive"),
    (["simulate", "--rate", "-2"], "rate=-2.0: must be a positive"),
    (["simulate", "--system", "nope", "--rate", "1"], "system='nope': unknown"),
    (["simulate", "--arrivals", "nope", "--rate", "1"], "arrivals='nope': unknown"),
    (["capacity", "--arrivals", "nope"], "arrivals='nope': unknown"),
    (["capacity", "--system", "nope"], "system='nope': unknown"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_malformed_trace_line_via_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n[1,\n')
    code, _, err = run_cli(["simulate", "--trace", str(path)], capsys)
    assert code == 2 and "bad.jsonl:2" in err


def test_simulate_json_is_byte_identical_for_one_seed(tmp_path: Path) -> None:
    texts = []
    for k in range(2):
        main(["simulate", "--rate", "2.5", "--requests", "400", "--arrivals", "poisson",
              "--seed", "7", "--json", "--out", str(tmp_path / str(k))])
        texts.append((tmp_path / str(k) / "result.json").read_bytes())
    assert texts[0] == texts[1]
    result = json.loads(texts[0])
    for key in ("system", "offered_rps", "throughput_rps", "completed", "ttft_s", "tpot_s",
                "offload_fraction", "egress_gbps", "utilization", "events"):
        assert key in result
    assert result["completed"] == 400


def test_trace_replay_with_rate(capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).resolve().parents[2] / "src/prfaas/data/traces/azure_llm_code_2023.csv"
    code, out, _ = run_cli(["simulate", "--trace", str(trace), "--rate", "2", "--requests",
                            "300", "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["completed"] == 300
    assert "rescaled to 2 req/s" in result["workload"]
