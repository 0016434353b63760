"""sim-vs-live without a live engine: the comparison's figures, its bootstrap interval, the
no-simulator baseline and the verdict (each with a negative control); the calibration on idle
points (service scale, counted S_kv, overheads) recovering a known synthetic deployment where
the additive-overhead model cannot; a load that does not finish in its time ending in one
line; the whole run with a stand-in live world; the committed results' schema. The measured
vLLM profile round-trips through the profile reader and `prfaas plan`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from prfaas.cli import main
from prfaas.core.errors import ConfigError
from prfaas.experiments import idle_routes
from prfaas.experiments.idle_routes import OUTPUT_TOKENS
from prfaas.experiments.sim_vs_live import (
    baseline,
    calibration,
    capacity,
    compare,
    live,
    simulated,
    workload,
)
from prfaas.experiments.sim_vs_live import run as svl_run
from prfaas.experiments.sim_vs_live import scenario as svl_scenario
from prfaas.experiments.sim_vs_live.options import MIN_REQUESTS, QUICK, Options
from prfaas.integrations.vllm.profile import (
    VllmProfile,
    connector_kv_bytes,
    profile_document,
    step_s,
)
from prfaas.integrations.vllm.served_model import ServedModel
from prfaas.models.profile_file import load_profile_file
from prfaas.serve.router.plan import profile_path
from prfaas.serve.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "sim_vs_live"
CTX = 16384  # the native tiny model's context
# a Qwen3-Next-shaped config (3 GDN + 1 attention layer), as prfaas vllm-model builds it
HYBRID_CONFIG = {
    "model_type": "qwen3_next", "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "eos_token_id": 1}


@pytest.fixture()
def hybrid(tmp_path: Path) -> ServedModel:
    (tmp_path / "config.json").write_text(json.dumps(HYBRID_CONFIG))
    return ServedModel("tiny", 4096, 128, str(tmp_path),
                       ("--enforce-eager", "--mamba-ssm-cache-dtype", "float32"))


def _vllm_local(model: ServedModel) -> Any:
    """topologies/vllm-local.yaml with its model at `model`'s directory: the scenario reads
    the model's config.json (layers, state size); a fresh clone has not built the topology's
    own model when these tests run."""
    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    assert topo.vllm is not None
    return replace(topo, vllm=replace(topo.vllm, model_dir=model.model_dir))


def _vllm_profile(model: ServedModel, scale: float = 1.0) -> VllmProfile:
    lengths = (256, 512, 1024, 2048, 3072)
    # a quadratic T(l) like the CPU build's (~1 ms/token plus a fixed cost)
    prefill = tuple((n, scale * (0.03 + 9.5e-4 * n + 2e-8 * n * n)) for n in lengths)
    kv = tuple((n, connector_kv_bytes(model, n)) for n in lengths)
    return VllmProfile(prefill, kv, ((1, 0.012), (4, 0.016), (8, 0.021)), 2, 256)


def _write_profile(model: ServedModel, path: Path, scale: float = 1.0) -> Path:
    doc = profile_document(model, _vllm_profile(model, scale), "test cpu", "test")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_connector_kv_bytes_counts_whole_blocks_after_the_backoff(hybrid: ServedModel) -> None:
    per_block = connector_kv_bytes(hybrid, 130) - connector_kv_bytes(hybrid, 129)
    # 1 attention layer, 2 KV heads x 64 x (K, V) in bf16 = 512 bytes/token, 128-token blocks
    assert per_block == 128 * 512
    # 129 tokens: 128 computed on the producer (backoff 1), one block; 2..129 the same
    assert connector_kv_bytes(hybrid, 129) == connector_kv_bytes(hybrid, 2)
    fixed = connector_kv_bytes(hybrid, 129) - 128 * 512
    assert fixed > 100_000  # 3 GDN layers' fp32 SSM + conv state, sent once
    with pytest.raises(ConfigError, match="length_tokens"):
        connector_kv_bytes(hybrid, 0)


def test_decode_step_from_batch_wall_times() -> None:
    # batch of 3: 64 tokens take 0.9 s (median), 1 token 0.27 s: 63 steps in 0.63 s
    assert step_s([0.95, 0.9, 0.85], [0.2, 0.27, 0.3], 63) == pytest.approx(0.01)
    assert step_s([0.1], [0.2], 10) == 0.0  # noise cannot make a step negative
    with pytest.raises(ConfigError, match="decode_steps"):
        step_s([1.0], [0.1], 0)


def test_vllm_profile_round_trips_and_plan_accepts_it(hybrid: ServedModel, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_profile(hybrid, tmp_path / "vllm.yaml")
    hw = load_profile_file(path)
    assert hw.prefill is not None and hw.decode is not None
    for p in _vllm_profile(hybrid).prefill_s:
        assert float(hw.prefill.seconds(p[0])) == pytest.approx(p[1], rel=1e-3)  # exact quadratic
    assert float(hw.kv.size_bytes(1025)) == pytest.approx(connector_kv_bytes(hybrid, 1025),
                                                          rel=0.15)  # linear fit of a staircase
    assert hw.decode.bs_max == 8
    # the profile as it is, and the deployment's calibrated form (scaled pools, counted S_kv)
    for scales, kv in ((None, None), ({"prfaas": 1.2, "pd": 0.9}, [(1024, 900_000),
                                                                   (2048, 1_500_000)])):
        raw = svl_scenario.scenario_dict(_vllm_local(hybrid), path, QUICK, 4096, scales, kv)
        scenario = tmp_path / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(raw))
        main(["plan", "--scenario", str(scenario), "--json"])  # a bad scenario exits 2
        prf = json.loads(capsys.readouterr().out)["systems"]["prfaas_pd"]
        assert prf["threshold_tokens"] > 0 and prf["n_p"] + prf["n_d"] == 2
        assert prf["lambda_max"] > 0


# -- the comparison ----------------------------------------------------------------------------

TOPO = load_topology()
PROFILE = profile_path("cpu-tiny").resolve()
LENGTHS = workload.lengths_for(QUICK, CTX)


def _scenario(**kw: Any) -> dict[str, Any]:
    return svl_scenario.scenario_dict(TOPO, PROFILE, QUICK, CTX, **kw)


def _capacity(scenario: dict[str, Any]) -> float:
    return capacity.planner_capacity_rps(LENGTHS, scenario, 1024, 1, 1, 0.05)


def _load(fraction: float, scenario: dict[str, Any], requests: int = MIN_REQUESTS) -> Any:
    options = replace(QUICK, requests=requests, load_fractions=(fraction, 1.0))
    return workload.workloads(options, LENGTHS, _capacity(scenario))[0]


def _sides(topo_t: int = 1024, scale: float = 1.0, fraction: float = 0.4
           ) -> tuple[compare.Side, compare.Side]:
    """'live': the simulator on the committed CPU profile; 'sim': the same workload on a
    profile whose prefill times are `scale` x (and a topology whose t is `topo_t`)."""
    raw = _scenario()
    w = _load(fraction, raw)
    live_side, _ = simulated.simulate_side(TOPO, raw, w, 12)
    other = _scenario(service_scale={"prfaas": scale, "pd": scale}) if scale != 1.0 else raw
    topo2 = replace(TOPO, policy_args={**TOPO.policy_args, "threshold_tokens": topo_t})
    sim, _ = simulated.simulate_side(topo2, other, w, 12)
    return live_side, sim


def _entry(live_side: compare.Side, sim: compare.Side, share: float = 0.4,
           base: np.ndarray | None = None) -> dict[str, Any]:
    base = live_side.ttft_s * 1.5 if base is None else base
    return compare.load_entry(0.5, share, live_side, sim, base, seed=7)


def test_identical_worlds_give_zero_error_and_a_zero_width_interval() -> None:
    live_side, sim = _sides()
    entry = _entry(live_side, sim)
    assert entry["ttft_mape"] == 0.0 and entry["ttft_mape_ci90"] == [0.0, 0.0]
    assert entry["route_agreement"] == 1.0 and entry["requests"] == MIN_REQUESTS
    assert entry["ttft_mape_by_live_route"] == {"prfaas": 0.0, "pd": 0.0}
    assert entry["ttft_p50_err"] == entry["ttft_p90_err"] == entry["e2e_mean_err"] == 0.0
    assert entry["baseline_ttft_mape"] == pytest.approx(0.5, abs=1e-4)
    assert entry["throughput_live_rps"] == entry["throughput_sim_rps"] > 0
    assert 0 < entry["offload_live"] < 1  # both routes exercised


def test_negative_control_shifted_profile_gives_a_large_mape() -> None:
    live_side, sim = _sides(scale=1.5)
    entry = _entry(live_side, sim)
    assert entry["ttft_mape"] > 0.3 and entry["ttft_bias"] > 0.3  # prefill is most of TTFT
    assert entry["ttft_p50_err"] > 0.3 and entry["e2e_mean_err"] > 0.1
    lo, hi = entry["ttft_mape_ci90"]
    assert lo < entry["ttft_mape"] < hi  # a real interval around the mean
    assert entry["route_agreement"] == 1.0  # the threshold policy ignores prefill speed
    assert min(entry["ttft_mape_by_live_route"].values()) > 0.1  # both routes prefill
    assert compare.meets_goal([entry])["ttft_mape"] is False


def test_negative_control_another_threshold_breaks_route_agreement() -> None:
    live_side, sim = _sides(topo_t=4096)
    entry = _entry(live_side, sim)
    # the t=4096 world keeps the 1K-4K prompts local that the t=1024 world offloads
    assert live_side.remote.sum() > sim.remote.sum() and entry["route_agreement"] < 0.95
    assert compare.meets_goal([entry])["route_agreement"] is False


def test_the_bootstrap_interval_is_seeded_and_narrows_with_more_requests() -> None:
    rng = np.random.default_rng(0)
    live_t = rng.uniform(0.5, 2.0, 400)
    sim_t = live_t * rng.uniform(0.7, 1.3, 400)
    small = compare.mape_ci90(live_t[:48], sim_t[:48], seed=3)
    assert small == compare.mape_ci90(live_t[:48], sim_t[:48], seed=3)
    assert small != compare.mape_ci90(live_t[:48], sim_t[:48], seed=4)
    large = compare.mape_ci90(live_t, sim_t, seed=3)
    assert small is not None and large is not None
    assert small[0] <= compare.mape(live_t[:48], sim_t[:48]) <= small[1]  # type: ignore[operator]
    assert large[1] - large[0] < 0.6 * (small[1] - small[0])
    assert compare.mape_ci90(live_t, np.full(400, np.nan), seed=3) is None


def test_the_verdict_needs_the_floor_the_baseline_beaten_and_a_loaded_point() -> None:
    live_side, sim = _sides()
    good = _entry(live_side, sim, share=0.75)
    assert compare.load_verdict(good)["predicts"] is True
    assert compare.verdict([good, _entry(live_side, sim, share=0.25)])["predicts"] is True
    # the same perfect simulator on fewer requests than the floor: no verdict
    few = {**good, "compared": MIN_REQUESTS - 1}
    assert compare.load_verdict(few)["predicts"] is False
    assert "fewer than the 48" in compare.load_verdict(few)["why"]
    assert compare.meets_goal([few])["requests"] is False
    # a baseline as good as the simulator within its interval: not "predicts"
    _, worse = _sides(scale=1.2)
    tie = _entry(live_side, worse, share=0.75, base=worse.ttft_s * 1.001)
    assert compare.load_verdict(tie)["predicts"] is False
    assert "does not beat" in compare.load_verdict(tie)["why"]
    # every load predicts, but none is loaded: the run does not claim a deployment under load
    light = compare.verdict([_entry(live_side, sim, share=0.25), _entry(live_side, sim, 0.5)])
    assert light["predicts"] is False and "no load at 75%" in light["line"]


def test_throughput_counts_completed_requests_over_the_span() -> None:
    side = compare.Side(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.5, 0.5, np.nan, 0.5]),
                        np.array([1.0, 2.0, np.nan, 4.0]), np.array([True, False, True, False]))
    assert compare.throughput_rps(side) == pytest.approx(3 / 4.0)
    with pytest.raises(ConfigError):
        compare.route_agreement(side, replace(side, remote=side.remote[:2]))
    with pytest.raises(ConfigError, match="two positive loads"):
        Options(requests=8, load_fractions=(0.5,))


def test_warmup_lengths_spread_over_both_routes() -> None:
    """The warm-up's lengths reach both prefill instances at the shipped threshold (1024):
    some below it, some at or above it, spread over the distribution."""
    lengths = workload.lengths_for(QUICK, 4096)
    warm = workload.warmup_lengths(lengths, QUICK.warmup_requests)
    assert len(warm) == 8 and warm == sorted(warm) and len(set(warm)) == 8
    assert sum(n < 1024 for n in warm) >= 2 and sum(n >= 1024 for n in warm) >= 2
    assert lengths.lo <= warm[0] and warm[-1] <= lengths.hi
    assert workload.warmup_lengths(lengths, 0) == []
    with pytest.raises(ConfigError, match="warmup_requests"):
        replace(QUICK, warmup_requests=-1)


# -- the baseline and the calibration on a synthetic deployment --------------------------------

TRUE_SCALE = {"prfaas": 1.3, "pd": 1.3}
TRUE_OVERHEAD = {"pd": 0.02, "prfaas": 0.05}
IDLE_LENGTHS = [256, 512, 1024, 2048, 4096]


def _idle_points(scenario: dict[str, Any], overhead: dict[str, float], scale: float = 1.3,
                 kv_factor: float | None = None) -> list[dict[str, Any]]:
    """Idle points of a synthetic deployment: `scenario` with `overhead` per route; each point's
    `prefill_s` is its prefill time there (the profile's x `scale`), `kv_wire_bytes` (when
    `kv_factor`) the profile's S_kv(l) x that factor."""
    lone = simulated.simulate_lone(TOPO, scenario, IDLE_LENGTHS, OUTPUT_TOKENS, 12)
    hw = load_profile_file(PROFILE)
    assert hw.prefill is not None
    out = []
    for n, t, r in zip(IDLE_LENGTHS, lone.ttft_s, lone.remote, strict=True):
        route = "prfaas" if r else "pd"
        p: dict[str, Any] = {"route": route, "length_tokens": n,
                             "ttft_s": float(t) + overhead[route],
                             "prefill_s": scale * float(hw.prefill.seconds(n))}
        if kv_factor is not None:
            p["kv_wire_bytes"] = int(kv_factor * float(hw.kv.size_bytes(n)))
        out.append(p)
    return out


def test_baseline_interpolates_each_routes_idle_ttft_and_extends_its_ends() -> None:
    pts = [{"route": "pd", "length_tokens": 256, "ttft_s": 0.2},
           {"route": "pd", "length_tokens": 256, "ttft_s": 0.4},
           {"route": "pd", "length_tokens": 512, "ttft_s": 0.5},
           {"route": "prfaas", "length_tokens": 2048, "ttft_s": 2.0},
           {"route": "prfaas", "length_tokens": 4096, "ttft_s": 4.0}]
    got = baseline.predict(pts, np.array([256, 384, 128, 1024, 3072, 5120]),
                           np.array([False, False, False, True, True, True]))
    # medians 0.3 at 256 and 0.5 at 512; the PrfaaS line 1 ms/token
    assert got == pytest.approx([0.3, 0.4, 0.2, 1.0, 3.0, 5.0])
    assert np.isnan(baseline.predict(pts[:3], np.array([2048]), np.array([True]))).all()
    assert baseline.interpolate(np.array([1.0, 2.0]), np.array([1.0, 0.5]),
                                np.array([10.0]))[0] == pytest.approx(0.05)  # floored


def test_calibration_recovers_a_slower_deployment_that_overheads_alone_cannot() -> None:
    """The synthetic deployment's prefills take 1.3x the profile's T(l) and each route pays a
    fixed overhead. From its idle points alone the calibration finds both; the calibrated
    simulator then predicts its loaded point. The additive-overhead model (scale=False) is the
    negative control: fitted on the same idle points, it cannot follow a slower service."""
    true = _scenario(service_scale=TRUE_SCALE)
    pts = _idle_points(true, TRUE_OVERHEAD)
    cal = calibration.calibrate(TOPO, PROFILE, QUICK, CTX, pts, 12, None)
    assert cal.service_scale == pytest.approx(TRUE_SCALE)
    assert cal.overhead_s == pytest.approx(TRUE_OVERHEAD, abs=1e-5)
    old = calibration.calibrate(TOPO, PROFILE, QUICK, CTX, pts, 12, None, scale=False)
    assert old.service_scale == {} and old.overhead_s["prfaas"] > 0.3  # the slowdown, as a delay
    loaded = _load(0.75, cal.scenario)
    live_side, _ = simulated.simulate_side(TOPO, true, loaded, 12, TRUE_OVERHEAD)
    base = baseline.predict(pts, loaded.input_tokens, live_side.remote)
    sims = {name: simulated.simulate_side(TOPO, c.scenario, loaded, 12, c.overhead_s)[0]
            for name, c in (("calibrated", cal), ("additive", old))}
    good = compare.load_entry(0.75 * _capacity(cal.scenario), 0.75, live_side,
                              sims["calibrated"], base, 1)
    bad = compare.load_entry(0.75 * _capacity(cal.scenario), 0.75, live_side,
                             sims["additive"], base, 1)
    assert good["ttft_mape"] < 1e-3 and compare.load_verdict(good)["predicts"]
    assert bad["ttft_mape"] > 0.1 and not compare.load_verdict(bad)["predicts"]
    # the baseline knows the idle deployment and not its queues: worse at the loaded point
    light = _load(0.25, cal.scenario)
    light_live, _ = simulated.simulate_side(TOPO, true, light, 12, TRUE_OVERHEAD)
    light_base = compare.mape(light_live.ttft_s,
                              baseline.predict(pts, light.input_tokens, light_live.remote))
    assert light_base is not None and good["baseline_ttft_mape"] > 1.5 * light_base


def test_the_simulators_kv_is_what_the_connector_counted_on_the_idle_points() -> None:
    raw = _scenario()
    counted = calibration.calibrate(TOPO, PROFILE, QUICK, CTX,
                                    _idle_points(raw, TRUE_OVERHEAD, 1.0, kv_factor=1.19),
                                    12, None)
    formula = calibration.calibrate(TOPO, PROFILE, QUICK, CTX,
                                    _idle_points(raw, TRUE_OVERHEAD, 1.0), 12, None)
    from prfaas.scenario import parse_scenario

    kv_counted = parse_scenario(counted.scenario).kv
    kv_profile = load_profile_file(PROFILE).kv
    for n in (1024, 3000):
        assert float(kv_counted.size_bytes(n)) == pytest.approx(
            1.19 * float(kv_profile.size_bytes(n)), rel=1e-3)
    assert counted.describe()["kv"]["source"] == "counted by the connector"
    # negative control: points without counted bytes leave the profile's S_kv(l)
    assert "profile" in formula.scenario["kv"] and "points" not in formula.scenario["kv"]
    assert calibration.counted_kv_points([{"length_tokens": 2048, "kv_bytes": 5}] * 3) == []


def test_idle_points_are_half_a_block_off_the_profiles_whole_blocks() -> None:
    """A whole number of blocks is the connector's special case (no partial block's state
    snapshot, a full last block); the idle points count a typical prompt's bytes instead,
    on the same routes as the profile's lengths at the shipped t."""
    assert idle_routes.usable_lengths([256, 512, 1024, 2048, 4096], CTX, 64) == \
        [224, 480, 992, 2016, 4064]
    assert idle_routes.usable_lengths([256, 1024, 2048, 3072, 4300], 4096, 256) == \
        [256, 896, 1920, 2944]  # 4300 - 128 leaves no room for the output in 4096
    assert idle_routes.usable_lengths([256, 2048], CTX) == [256, 2048]  # no block: as given


def test_idle_points_give_each_route_its_measured_overhead(tmp_path: Path) -> None:
    pts = _idle_points(_scenario(), {"pd": 0.04, "prfaas": 0.11}, 1.0)
    cal = calibration.calibrate(TOPO, PROFILE, QUICK, CTX, pts, 12, None)
    assert cal.overhead_s == pytest.approx({"pd": 0.04, "prfaas": 0.11}, abs=1e-5)
    assert cal.service_scale == pytest.approx({"pd": 1.0, "prfaas": 1.0})
    # negative control: no idle points, no overhead at all
    assert calibration.calibrate(TOPO, PROFILE, QUICK, CTX, [], 12, None).overhead_s == {}
    # a point the simulator routes the other way is refused, not averaged in
    pts[0]["route"] = "prfaas"  # 256 tokens stay local at t=1024
    with pytest.raises(ConfigError, match="routed this idle point elsewhere"):
        calibration.calibrate(TOPO, PROFILE, QUICK, CTX, pts, 12, None)


def test_route_overheads_shift_only_the_first_token_of_their_route() -> None:
    raw = _scenario()
    w = workload.workloads(QUICK, LENGTHS, 1.0)[1]
    plain, _ = simulated.simulate_side(TOPO, raw, w, 12)
    shifted, cfg = simulated.simulate_side(TOPO, raw, w, 12, {"pd": 0.05, "prfaas": 0.2})
    assert cfg["local_overhead_s"] == 0.05 and cfg["remote_overhead_s"] == 0.2
    expect = np.where(plain.remote, 0.2, 0.05)
    assert plain.remote.any() and (~plain.remote).any()
    assert np.allclose(shifted.ttft_s - plain.ttft_s, expect, rtol=0, atol=1e-9)
    assert np.array_equal(shifted.finish_s, plain.finish_s)  # it occupies no instance
    assert np.array_equal(shifted.remote, plain.remote)


def test_idle_points_are_read_with_a_clear_error_on_a_bad_one(tmp_path: Path) -> None:
    from prfaas.models.profile_file import idle_ttft_points

    doc = yaml.safe_load(PROFILE.read_text())
    doc["idle_ttft"] = {"how": "test", "points": [
        {"route": "pd", "length_tokens": 256, "ttft_s": 0.1, "kv_wire_bytes": 7},
        {"route": "pd", "ttft_s": 0.1}]}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="length_tokens"):
        idle_ttft_points(bad)
    doc["idle_ttft"]["points"].pop()
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(doc))
    assert idle_ttft_points(good)[0]["kv_wire_bytes"] == 7
    load_profile_file(good)  # the planner's reader accepts the section


# -- shared cores, the link, the capacity -------------------------------------------------------

def test_topology_cores_become_the_simulators_shared_groups(tmp_path: Path) -> None:
    from prfaas.serve.cores import shared_core_groups

    vtopo = load_topology(str(ROOT / "topologies" / "vllm-local.yaml"))
    sharing = svl_scenario.core_sharing(vtopo, PROFILE)
    assert sharing["groups"] == [["prfaas-0", "pdp-0"]]  # both pinned to core 0
    assert sharing["sim_groups"] == [["prfaas-p0000", "pd-p0000"]]
    assert sharing["factor"] == 2.0 and "default" in sharing["factor_source"]
    doc = yaml.safe_load(PROFILE.read_text())
    doc["core_sharing"] = {"how": "test", "factor": 1.7, "points": []}
    measured = tmp_path / "measured.yaml"
    measured.write_text(yaml.safe_dump(doc))
    assert svl_scenario.core_sharing(vtopo, measured)["factor"] == 1.7
    doc["core_sharing"]["factor"] = 0.4  # a speed-up is no measurement of sharing
    measured.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"core_sharing\.factor"):
        svl_scenario.core_sharing(vtopo, measured)
    # negative control: the native topology pins nothing, so nothing is shared
    assert svl_scenario.core_sharing(TOPO, measured)["sim_groups"] == []
    ws = [type("W", (), {"name": n, "cores": c})() for n, c in
          (("a", "0-1"), ("b", "2"), ("c", "1"), ("d", None), ("e", "3"), ("f", "3"))]
    assert shared_core_groups(ws) == [("a", "c"), ("e", "f")]


def test_shared_cores_slow_only_overlapping_prefills_in_sim_vs_live() -> None:
    pinned = replace(TOPO, workers=tuple(
        replace(w, cores="0" if w.role in ("prfaas", "pd-p") else "1") for w in TOPO.workers))
    raw = _scenario()
    w = workload.workloads(QUICK, LENGTHS, 1.0)[1]
    sharing = svl_scenario.core_sharing(pinned, None)
    assert sharing["sim_groups"] and sharing["factor"] == 2.0
    plain, cfg0 = simulated.simulate_side(TOPO, raw, w, 12)
    shared, cfg = simulated.simulate_side(pinned, raw, w, 12, sharing=sharing)
    assert "core_groups" not in cfg0 and cfg["core_share_factor"] == 2.0
    slower = shared.ttft_s - plain.ttft_s
    assert np.all(slower >= -1e-9) and np.any(slower > 1e-3)  # overlaps cost (here none gains)


def test_the_simulated_link_sends_in_the_order_the_engines_sender_does(
        hybrid: ServedModel) -> None:
    """vLLM's connector queues one destination's layers in order (fifo); the native worker
    interleaves transfers (shared). The scenario sim-vs-live builds says which, and the
    simulator it builds uses it."""
    from prfaas.scenario import parse_scenario
    from prfaas.sim.link import FifoLink, SharedLink
    from prfaas.sim.simulator import Simulator
    from prfaas.sim.system import build_system

    for topo, order, link_type, released in (
            (_vllm_local(hybrid), "fifo", FifoLink, True), (TOPO, "shared", SharedLink, False)):
        raw = svl_scenario.scenario_dict(topo, PROFILE, QUICK, 4096)
        assert raw["link"]["order"] == order
        cfg = build_system(parse_scenario(raw), "prfaas_pd", threshold_tokens=1024)
        w = workload.workloads(QUICK, workload.lengths_for(QUICK, 4096), 1.0)[0]
        assert isinstance(Simulator(cfg, w).link, link_type)
        # vLLM's connector: 1024-token steps, the one attention layer of four at 7/8 of a
        # step's forward, the GDN states after the last step; the native worker: per layer
        assert (cfg.kv_release is not None) == released
        if cfg.kv_release is not None:
            assert cfg.kv_release.chunk_tokens == 1024
            assert [list(p) for p in cfg.kv_release.save_points] == [[0.875, 1.0]]
            assert cfg.kv_release.state_bytes > 0


def test_a_shared_core_bounds_the_capacity_the_loads_are_fractions_of() -> None:
    """Two prefill instances on one core: together they carry at most one core's prefill
    work, 1 / E[T(l)] over the whole distribution at f = 2 (2/f of it at another f), however
    the threshold splits it; the planner's terms alone count two machines."""
    from prfaas.planner.throughput import mean_service_s

    prefill = load_profile_file(PROFILE).prefill
    assert prefill is not None
    one_core = 1.0 / mean_service_s(LENGTHS, prefill, "exact")
    raw = _scenario()
    alone = capacity.planner_capacity_rps(LENGTHS, raw, 1024, 1, 1, 100.0)
    for factor in (2.0, 1.5):
        sharing = {"sim_groups": [["prfaas-p0000", "pd-p0000"]], "factor": factor}
        shared = capacity.shared_core_capacity_rps(LENGTHS, raw, 1024, 1, 1, sharing)
        assert shared == pytest.approx(one_core * 2.0 / factor, rel=1e-9)
        assert capacity.planner_capacity_rps(LENGTHS, raw, 1024, 1, 1, 100.0, sharing) == \
            pytest.approx(min(alone, shared), rel=1e-12)
    assert alone > one_core  # here the shared core is what binds
    assert capacity.shared_core_capacity_rps(LENGTHS, raw, 1024, 1, 1, {"sim_groups": []}) \
        is None
    # a slower deployment (calibrated prefill) carries proportionally less
    slow = capacity.planner_capacity_rps(LENGTHS, _scenario(service_scale={"prfaas": 2.0,
                                                                           "pd": 2.0}),
                                         1024, 1, 1, 100.0)
    assert slow == pytest.approx(alone / 2.0, rel=1e-6)


# -- a load that does not finish, the whole run, the committed results -------------------------

def test_a_request_past_the_loads_deadline_times_out() -> None:
    """`run_load`'s deadline ends a request still streaming at it (a negative control: the
    same request with no deadline completes)."""
    from aiohttp import web

    from prfaas.bench.loadgen import run_load
    from prfaas.bench.workload import BenchRequest

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.6)
        await resp.write(b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n')
        return resp

    async def go(deadline: float | None) -> list[Any]:
        app = web.Application()
        app.router.add_post("/v1/completions", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await run_load(f"http://127.0.0.1:{port}", "m", [BenchRequest([5], 1)] * 2,
                                  [0.0, 0.1], timeout_s=30.0, deadline_s=deadline)
        finally:
            await runner.cleanup()

    cut = asyncio.run(go(0.3))
    assert [r.ok for r in cut] == [False, False]
    assert all(r.error.startswith("TimeoutError") for r in cut)
    assert [r.ok for r in asyncio.run(go(None))] == [True, True]


def test_an_incomplete_load_is_one_line_saying_which_and_why() -> None:
    extra = {"errors": 5, "timed_out": 3, "error_samples": [
        "TimeoutError: ", "HTTP 502 transfer_failed: peer gone"]}
    line = live.incomplete_line(1, 2, 0.75, 1.5, extra, 48, 86.0)
    assert line is not None and "\n" not in line
    assert line.startswith("load 2 of 2 (0.75 of capacity, 1.500 req/s): 43 of 48")
    assert "3 still running at the limit" in line and "2 failed (HTTP 502" in line
    assert live.incomplete_line(0, 2, 0.25, 0.5, {**extra, "errors": 0}, 48, 86.0) is None


def _stand_in(monkeypatch: pytest.MonkeyPatch, slow: float, fail_load: int | None = None
              ) -> list[str]:
    """The deployment replaced by the simulator on a `slow` x slower profile (with its own
    idle points): svl's live side without processes. Returns the idle-point URLs asked."""
    import contextlib

    import prfaas.experiments.runs as runs

    kv = load_profile_file(PROFILE).kv
    true = _scenario(service_scale={"prfaas": slow, "pd": slow},
                     kv_points=[(n, int(1.1 * float(kv.size_bytes(n)))) for n in IDLE_LENGTHS])

    def fake_live(url: str, model: str, w: Any, vocab: int, seed: int,
                  limit_s: float | None = None) -> tuple[compare.Side, dict[str, Any]]:
        side, _ = simulated.simulate_side(TOPO, true, w, 12, TRUE_OVERHEAD)
        n = side.arrival_s.size
        failed = 3 if fail_load is not None and seed == QUICK.seed + 1 + fail_load else 0
        if failed:
            side = replace(side, ttft_s=np.where(np.arange(n) < n - failed, side.ttft_s,
                                                 np.nan))
        return side, {"errors": failed, "timed_out": failed,
                      "error_samples": ["TimeoutError: "] if failed else [], "retried": 0,
                      "loadavg_1m_before_after": [0.0, 0.0], "kv_bytes": [0] * n,
                      "kv_wire_bytes": [0] * n, "prefill_s": [None] * n,
                      "router_overhead_s": [None] * n}

    monkeypatch.setattr(runs, "deployed", lambda *a, **k: contextlib.nullcontext(
        type("Dep", (), {"url": "http://stand-in"})()))
    monkeypatch.setattr(live, "live_side", fake_live)
    monkeypatch.setattr(live, "served_model", lambda url: "tiny")
    monkeypatch.setattr(idle_routes, "warm_up", lambda url, model, lengths, *a: [
        {"length_tokens": n, "ok": True, "route": "pd" if n < 1024 else "prfaas",
         "ttft_s": 0.1, "prefill_s": 0.1} for n in lengths])
    asked: list[str] = []

    def fake_idle_points(url: str, *a: object) -> list[dict[str, Any]]:
        asked.append(url)
        return _idle_points(true, TRUE_OVERHEAD, slow, kv_factor=1.1)

    monkeypatch.setattr(live, "deployment_idle_points", fake_idle_points)
    return asked


LOAD_KEYS = {"requests", "offered_rps", "share_of_capacity", "ttft_mape", "ttft_mape_ci90",
             "baseline_ttft_mape", "ttft_mape_without_route_overheads", "ttft_p50_err",
             "ttft_p90_err", "e2e_mean_err", "e2e_mape", "throughput_live_rps",
             "throughput_sim_rps", "route_agreement", "per_request"}


def test_run_writes_the_schema_end_to_end_with_a_stand_in_live_world(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """svl's run with the deployment replaced by the simulator on a 1.3x slower deployment:
    every documented key, a calibration that finds the slowdown, per-request arrays that
    recompute the load's figures, and a verdict that holds on the calibrated simulator."""
    asked = _stand_in(monkeypatch, 1.3)
    options = replace(QUICK, requests=MIN_REQUESTS)
    result = svl_run.run(TOPO, PROFILE, options, tmp_path)
    assert asked == ["http://stand-in"] and result["idle_points_source"] == "deployment"
    assert result["service_scale"] == pytest.approx(TRUE_SCALE)
    assert result["route_overhead_s"] == pytest.approx(TRUE_OVERHEAD, abs=1e-5)
    assert result["calibration"]["kv"]["source"] == "counted by the connector"
    assert result["planner_capacity_rps"] < result["planner_capacity_profile_rps"]
    assert result["engine"] == "native" and result["host"]["cpus"]
    assert [x["share_of_capacity"] for x in result["loads"]] == [0.25, 0.75]
    for load in result["loads"]:
        assert set(load) >= LOAD_KEYS and load["requests"] == MIN_REQUESTS
        assert load["ttft_mape"] < 1e-3 and load["ttft_mape_profile_only"] > 0.1
        pr = load["per_request"]
        live_t = np.array(pr["ttft_live_s"], dtype=float)
        base_t = np.array(pr["ttft_baseline_s"], dtype=float)
        assert load["baseline_ttft_mape"] == pytest.approx(
            float(np.mean(np.abs(base_t - live_t) / live_t)), abs=1e-3)
    assert result["verdict"]["predicts"] is True and "incomplete" not in result
    json.dumps(result)  # serializable as written


def test_a_load_that_does_not_finish_stops_the_run_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(monkeypatch, 1.0, fail_load=0)
    result = svl_run.run(TOPO, PROFILE, QUICK, tmp_path)
    assert len(result["loads"]) == 1  # the second load was not started
    assert result["incomplete"].startswith("load 1 of 2 (0.25 of capacity")
    assert result["verdict"]["predicts"] is False


def test_cli_ends_an_incomplete_run_in_one_line_and_keeps_what_it_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _stand_in(monkeypatch, 1.0, fail_load=1)
    with pytest.raises(SystemExit) as done:
        main(["sim-vs-live", "--quick", "--profile", str(PROFILE), "--out", str(tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert done.value.code == 2 and err[-1].startswith("error: sim-vs-live stopped: load 2 of 2")
    assert "still running at the limit" in err[-1]
    kept = json.loads((tmp_path / "sim_vs_live.json").read_text())
    assert len(kept["loads"]) == 2 and kept["incomplete"]
    with pytest.raises(SystemExit) as done:
        main(["sim-vs-live", "--loads", "0.5", "--profile", str(PROFILE),
              "--out", str(tmp_path)])
    bad = capsys.readouterr().err
    assert done.value.code == 2 and "two positive loads" in bad and bad.count("\n") == 1


RUNS = sorted(RESULTS.glob("*.json"))


def _rounding(live_t: np.ndarray, sim: np.ndarray, ok: np.ndarray) -> float:
    """How far a MAPE recomputed from the per-request times (rounded to 1e-4 s in the file)
    can be from the one computed before rounding (rounded to 4 decimals): each |sim - live| /
    live moves by at most (h + h sim / live) / (live - h), h = 5e-5 s, plus 5e-5 for the
    stated figure's own rounding."""
    h = 5e-5
    lv, sv = live_t[ok], np.abs(sim[ok])
    return float(np.mean((h + h * sv / lv) / (lv - h))) + h


def _arr(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values])


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_committed_results_follow_the_schema_and_recompute(path: Path) -> None:
    r = json.loads(path.read_text())
    assert r["engine"] in ("vllm", "native") and r["profile"]["prefill"]["points"]
    assert r["planner_capacity_rps"] > 0 and r["host"]["cpus"]
    assert any(x["share_of_capacity"] >= r["loaded_share"] for x in r["loads"])
    for load in r["loads"]:
        assert set(load) >= LOAD_KEYS and load["requests"] >= MIN_REQUESTS
        pr = load["per_request"]
        live_t = _arr(pr["ttft_live_s"])
        for key, series in (("ttft_mape", "ttft_sim_s"), ("baseline_ttft_mape",
                                                          "ttft_baseline_s"),
                            ("ttft_mape_without_route_overheads",
                             "ttft_sim_without_route_overheads_s")):
            other = _arr(pr[series])
            ok = np.isfinite(live_t) & np.isfinite(other)
            assert load[key] == pytest.approx(
                float(np.mean(np.abs(other[ok] - live_t[ok]) / live_t[ok])),
                abs=_rounding(live_t, other, ok))
        lo, hi = load["ttft_mape_ci90"]
        assert lo <= load["ttft_mape"] <= hi
        agree = np.mean(np.array(pr["remote_live"]) == np.array(pr["remote_sim"]))
        assert load["route_agreement"] == pytest.approx(agree, abs=1e-4)


def test_a_committed_run_replays_its_own_workloads_and_refuses_another() -> None:
    """A run's workloads rebuild from its JSON (same seed, lengths, arrivals), for
    re-simulating it with another model; a run whose recorded lengths differ is refused."""
    assert {p.name.split("_run")[0] for p in RUNS} == {"native", "vllm"}  # the docs cite both
    doc = json.loads(RUNS[0].read_text())
    ctx = 4096 if doc["engine"] == "vllm" else CTX
    options, loads = workload.replay_workloads(doc, ctx)
    assert options.load_fractions == tuple(doc["options"]["load_fractions"])
    for w, entry in zip(loads, doc["loads"], strict=True):
        assert [int(x) for x in w.input_tokens] == entry["per_request"]["input_tokens"]
        assert w.input_tokens.size == entry["requests"]
    doc["loads"][1]["per_request"]["input_tokens"][3] += 1
    with pytest.raises(ConfigError, match="not the run's"):
        workload.replay_workloads(doc, ctx)
