"""The multi-cluster capacity search (experiments/regions_capacity.py), without a deployment:
the search along the plan's mix brackets the capacity from its own probes whatever it starts
from (a search that probes near a handed answer, the control, does not), the binding region is
the one whose own bracket is lowest, and `region_verdict` recomputes sim/regions_run.py's rule
from per-request times as the simulator does from its own event counts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prfaas.emulated.scales import Scales
from prfaas.experiments.probe import Bracket, ProbeResult
from prfaas.experiments.regions_capacity import (
    CapacityOptions,
    Judged,
    MixProbe,
    RegionVerdict,
    bracket_json,
    live_verdicts,
    probe_workloads,
    region_verdict,
    search,
    sim_verdicts,
)
from prfaas.experiments.regions_live import RegionRun, RegionsSetup, regions_setup
from prfaas.sim.regions import RegionsSimulator
from prfaas.sim.regions_run import build_regions, simulate_regions

CAPACITY = {"near": 0.93, "far": 1.41}  # each region's own limit along the mix (x)
SYSTEM_X = min(CAPACITY.values())


def fake_probe(x: float) -> MixProbe:
    rule = RegionVerdict(0.0, 0.0, 0.0, 0.0, 1, 1, True)
    return MixProbe(x, {k: Judged(ProbeResult(x, x <= c, x, 0.0, 0.0, 1, 1, {}, {}), rule)
                        for k, c in CAPACITY.items()})


def near_answer(start: float) -> Bracket:
    """The control: probe the start (an answer it is handed) and 1.5% below it only."""
    lo = hi = None
    for x in (start, start / 1.015):
        if fake_probe(x).sustainable:
            lo = max(lo or 0.0, x)
        else:
            hi = min(hi or float("inf"), x)
    return Bracket(lo, hi, lo is not None and hi is not None)


def holds_capacity(b: Bracket) -> bool:
    lo, hi = b.sustained_rps, b.unsustained_rps
    return lo is not None and hi is not None and lo <= SYSTEM_X < hi and (hi - lo) / lo <= 0.02


@pytest.mark.parametrize("start", [0.25, SYSTEM_X, 0.011, 40.0])
def test_search_brackets_the_binding_region_from_any_start(start: float) -> None:
    b = search(fake_probe, CapacityOptions(start_scale=start, max_probes=30)).run()
    assert holds_capacity(b), b


def test_a_search_near_a_handed_answer_fails_when_started_elsewhere() -> None:
    assert holds_capacity(near_answer(SYSTEM_X * 1.01))  # handed (nearly) the answer: fine
    assert not holds_capacity(near_answer(0.25))  # from a fixed start it misses it


def test_bracket_json_names_the_binding_region() -> None:
    s = search(fake_probe, CapacityOptions(max_probes=30))
    out = bracket_json(_setup(), s, s.run())
    near, far = (out["regions"][k]["own_bracket_scale"] for k in ("near", "far"))
    assert near[0] <= CAPACITY["near"] < near[1]
    assert far[0] is not None and far[0] <= CAPACITY["far"]  # far never failed below 1.41
    assert far[1] is None or far[1] > CAPACITY["far"]
    assert out["capacity_rps"] == pytest.approx(
        out["capacity_scale"] * sum(_setup().planned_rps().values()), rel=1e-3)


_SETUP: list[RegionsSetup] = []


def _setup() -> RegionsSetup:
    if not _SETUP:
        _SETUP.append(regions_setup("two-regions-live",
                                    Scales(time=0.5, bytes=2e-3, tokens=8, output=64)))
    return _SETUP[0]


@pytest.mark.parametrize("x", [0.5, 1.3])
def test_region_verdict_recomputes_the_simulators_rule(x: float) -> None:
    """The simulator counts requests in system as events happen; `region_verdict` from the
    arrival and finish times only. Long runs (the rule is the simulator's long-run rule): at
    half the plan both sustain, at 1.3x the plan near does not (the rule can fail)."""
    setup = _setup()
    work = probe_workloads(setup, x, CapacityOptions(probe_s=600.0))
    cfg = build_regions(setup.scenario, setup.plan, setup.share_policy, controller=False)
    units = {k: setup.to_scenario_units(w) for k, w in work.items()}
    sim = simulate_regions(cfg, units)["pd_clusters"]
    run = RegionsSimulator(cfg, units).run()
    verdicts = {r.setup.name: region_verdict(r.work.offered_rps(), r.work.arrival_s, r.finish)
                for r in run.regions}
    for k, v in verdicts.items():
        assert v.sustainable == sim[k]["sustainable"]
        assert v.throughput_rps == pytest.approx(sim[k]["throughput_rps"], rel=1e-6)
        # ties of an arrival and a finish at one instant may count either way: within 0.05
        assert abs(v.queue_growth - sim[k]["queue_growth"]) <= 0.05
    assert {k: v.sustainable for k, v in verdicts.items()}["near"] is (x < 1.0)


def test_region_verdict_counts_an_unfinished_request_as_in_system() -> None:
    arrival = np.arange(200) / 2.0
    finish = arrival + 1.0
    ok = region_verdict(2.0, arrival, finish)
    assert ok.sustainable and ok.queue_growth == 0.0
    finish[100:] = np.nan  # half never finish: the queue grows, the throughput falls
    bad = region_verdict(2.0, arrival, finish)
    assert not bad.sustainable and bad.queue_growth > 10


def test_live_verdicts_read_a_live_log_in_live_seconds() -> None:
    """The simulator's run written as a live log (times x a, as `run_live` records them) is
    judged as the simulator's own: the units are converted once, on the live side."""
    setup = _setup()
    opts = CapacityOptions()
    work = probe_workloads(setup, 0.875, opts)
    cfg = build_regions(setup.scenario, setup.plan, setup.share_policy, controller=False)
    run = RegionsSimulator(cfg, {k: setup.to_scenario_units(w) for k, w in work.items()}).run()
    a = setup.a
    logs = {r.setup.name: RegionRun(r.work.arrival_s * a, r.kv_at * a, r.kv_at * a,
                                    r.finish * a, r.offloaded, np.isfinite(r.finish),
                                    np.zeros(len(r.work)), ()) for r in run.regions}
    live, sim = live_verdicts(setup, work, logs), sim_verdicts(setup, work)
    for k in sim:
        lv, sm = live[k], sim[k]
        assert lv.sustainable == sm.sustainable
        assert lv.regions_rule.sustainable == sm.regions_rule.sustainable
        assert lv.probe.throughput_rps == pytest.approx(sm.probe.throughput_rps, rel=1e-9)
        assert lv.probe.queue_growth == pytest.approx(sm.probe.queue_growth, abs=1e-9)
        assert lv.probe.ttft_s["p90"] == pytest.approx(sm.probe.ttft_s["p90"], rel=1e-6)
    # the control: a log left in scenario seconds reads as a run at half the rate
    wrong = {k: replace(g, arrival_s=g.arrival_s / a, ready_s=g.ready_s / a,
                        finish_s=g.finish_s / a) for k, g in logs.items()}
    assert not any(v.sustainable for v in live_verdicts(setup, work, wrong).values())
