"""`prfaas reproduce --live`'s capacity search on one live emulated system (the tiny scenario):
the short search, its bracket judged again on long probes on both sides, every verdict with its
margin in requests, each live probe beside the simulator's verdict on the same workload. Shape
and consistency only: the figures belong to a loaded host (the measured runs are
benchmarks/results/live/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_scenario import write_scenario

from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.live import LiveOptions, SystemRun, _system_json
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario

pytestmark = pytest.mark.timeout(400)
SCALES = Scales(time=0.5, bytes=1e-2, tokens=4, output=4)
OPTIONS = LiveOptions(start_rps=2.0, probe_s=3.0, min_requests=12, max_requests=24,
                      ttft_requests=0, max_probes=6, rel_tol=0.15, own_shares=(),
                      confirm_requests=48, confirm_max_probes=3)


def test_live_search_confirms_its_bracket_on_long_probes_with_margins(tmp_path: Path) -> None:
    path = str(write_scenario(tmp_path))
    es = emulated_system(path, "prfaas_pd", SCALES, link_emulation="token-bucket")
    planner = plan_all(load_scenario(path), mode="exact").systems["prfaas_pd"].lambda_max
    sr = SystemRun(es, OPTIONS, lambda _: None, None, seed=1)
    sim = sr.sim_capacity(planner / SCALES.time)
    phase = sr.live_phase(0.0)  # no TTFT run
    out = _system_json(sr, phase, sim, planner, SCALES)
    for side in ("", "sim_"):
        short, confirm = out[f"{side}probes"], out[f"{side}confirm_probes"]
        assert short and confirm, side
        assert all(p["requests"] <= OPTIONS.max_requests for p in short)
        assert all(p["requests"] == OPTIONS.confirm_requests for p in confirm)
        for p in short + confirm:  # a margin's sign is its verdict
            assert p["sustained"] == (p["margin_requests"] >= 0), p
        edges = out[f"{side}bracket_margins"]
        lo, hi = out[f"{side}bracket_rps"]
        for key, rate in (("sustained", lo), ("unsustained", hi)):
            if rate is not None:  # the end's verdict is a long probe's, at that rate
                assert edges[key]["rate_rps"] == rate
                assert edges[key]["requests"] == OPTIONS.confirm_requests
    for p in out["confirm_probes"]:  # the simulator's verdict on each live long probe
        assert isinstance(p["sim_same_workload"]["sustained"], bool)
    assert out["live_capacity_rps"] == out["bracket_rps"][0]
