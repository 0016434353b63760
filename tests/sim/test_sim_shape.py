"""The shape controller in the simulator (sim/shape.py): on a mix that shifts it moves a PD
instance to the role the planner wants and back, each move drained, switched and priced, and the
phase it was for is served better than with the shape fixed; on a steady mix at the planned
split (the control) it moves nothing. `simulate --shape` gives the same."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prfaas.cli import main
from prfaas.core.errors import ConfigError
from prfaas.planner.search import inputs_from_scenario, plan_all
from prfaas.policy.shape import ShapeConfig, ShapeController
from prfaas.scenario import load_scenario
from prfaas.sim.outages import parse_outage
from prfaas.sim.run import simulate
from prfaas.sim.shape import ShapePlugin
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.requests import Workload, synthetic

CFG = ShapeConfig(period_s=10.0, window_s=75.0, min_window=30, persist_s=20.0, cooldown_s=20.0,
                  hold_s=100.0, switch_s=30.0, payback_s=300.0)


def _phase(median: float, sigma: float, rate: float, duration_s: float, start_s: float,
           seed: int) -> Workload:
    lengths = truncated_lognormal(float(np.log(median)), sigma, 128, 131072)
    w = synthetic(lengths, 1024, make_arrivals("uniform"), rate, round(rate * duration_s), seed,
                  stratified=True)
    return Workload(w.arrival_s - w.arrival_s[0] + start_s, w.input_tokens, w.output_tokens,
                    w.source)


def _join(*parts: Workload) -> Workload:
    return Workload(np.concatenate([p.arrival_s for p in parts]),
                    np.concatenate([p.input_tokens for p in parts]),
                    np.concatenate([p.output_tokens for p in parts]), "phases")


def _run(workload: Workload, shape: bool) -> tuple[dict, ShapePlugin | None]:
    s = load_scenario("shape-shift")
    cfg = build_system(s, "prfaas_pd")  # 1 PrfaaS, PD split 1:3 for the short mix
    assert (cfg.n_p, cfg.n_d) == (1, 3)
    plugin = ShapePlugin(ShapeController(inputs_from_scenario(s), CFG)) if shape else None
    _, summary = simulate(cfg, workload, plugins=[plugin] if plugin else [])
    return summary, plugin


def test_a_shift_to_long_prompts_moves_a_decoder_to_prefill_and_back() -> None:
    w = _join(_phase(3000, 0.8, 1.8, 600, 0.0, 0), _phase(30000, 0.6, 0.8, 600, 600.0, 1),
              _phase(3000, 0.8, 1.8, 600, 1200.0, 2))
    on, plugin = _run(w, shape=True)
    off, _ = _run(w, shape=False)
    changes = on["role_changes"]
    assert plugin is not None and [(c["from_role"], c["to_role"]) for c in changes] == [
        ("decode", "prefill"), ("prefill", "decode")]
    first, back = changes
    assert 600 < first["time_s"] < 1200 and back["time_s"] > 1200  # each in its phase
    assert "1:3" in first["reason"] and "2:2" in first["reason"]
    assert all(c["ready_s"] == pytest.approx(c["drained_s"] + CFG.switch_s) for c in changes)
    assert on["final_split"] == {"n_p": 1, "n_d": 3}
    assert on["shape"]["outcomes"]["completed"] == 2
    # the long phase is served better: fewer requests wait as long (TTFT), more finish
    assert on["ttft_s"]["p90"] < off["ttft_s"]["p90"]
    assert on["completed"] == off["completed"] == len(w)  # nothing lost either way


def test_a_steady_mix_at_the_planned_split_moves_nothing() -> None:
    s = load_scenario("shape-shift")
    rate = 0.8 * plan_all(s, mode="exact").systems["prfaas_pd"].lambda_max
    w = _phase(3000, 0.8, rate, 3600, 0.0, 7)
    on, plugin = _run(w, shape=True)
    assert plugin is not None and plugin.controller.last_solve is not None  # it did solve
    assert on["role_changes"] == [] and on["final_split"] == {"n_p": 1, "n_d": 3}


def test_simulate_shape_flag_and_its_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scenario", "shape-shift", "--n-p", "3", "--n-d", "1", "--rate",
            "1.5", "--duration", "900", "--shape", "--json"]
    main(args)
    out = json.loads(capsys.readouterr().out)
    # 3:1 is decode-bound on the short mix (planner: 0.78 vs 2.34 req/s at 1:3)
    assert [c["to_role"] for c in out["role_changes"]][:1] == ["decode"]
    assert out["final_split"]["n_d"] > 1 and "reason" in out["role_changes"][0]
    with pytest.raises(SystemExit) as exc:  # one line, exit 2
        main([*args, "--rebalance"])
    assert exc.value.code == 2 and "--rebalance" in capsys.readouterr().err
    s = load_scenario("shape-shift")
    with pytest.raises(ConfigError, match="--shape"):
        simulate(build_system(s, "prfaas_pd"), _phase(3000, 0.8, 1.0, 60, 0.0, 0),
                 outages=[parse_outage("pd-d@10+5")],
                 plugins=[ShapePlugin(ShapeController(inputs_from_scenario(s), CFG))])
