"""sim-vs-live and the measured vLLM profile without a live engine: the profile document
round-trips through the profile reader and `prfaas plan`; the connector's S_kv(l) rounds to
whole blocks; the comparison's MAPE, throughput and route agreement, each with a negative
control (a shifted profile, another threshold); the committed benchmark JSON's schema."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from prfaas.cli import main
from prfaas.core.errors import ConfigError
from prfaas.experiments import idle_routes
from prfaas.experiments import sim_vs_live as svl
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
RESULTS = ROOT / "benchmarks" / "results"
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


def _vllm_local(model: ServedModel) -> object:
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
    raw = svl.scenario_dict(_vllm_local(hybrid), path, svl.QUICK, 4096)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(raw))
    main(["plan", "--scenario", str(scenario), "--json"])  # a bad scenario exits 2
    plan = json.loads(capsys.readouterr().out)
    prf = plan["systems"]["prfaas_pd"]
    assert prf["threshold_tokens"] > 0 and prf["n_p"] + prf["n_d"] == 2
    assert prf["lambda_max"] > 0


def _sides(topo_t: int = 1024, scale: float = 1.0, fraction: float = 0.4,
           tmp: Path | None = None) -> tuple[svl.Side, svl.Side]:
    """'live': the simulator on the committed CPU profile; 'sim': the same workload on a
    profile whose prefill times are `scale` x (and a topology whose t is `topo_t`)."""
    topo = load_topology()
    true_profile = profile_path("cpu-tiny").resolve()
    lengths = svl.lengths_for(svl.QUICK, 16384)
    cap = svl.planner_capacity_rps(lengths, true_profile, 1024, 1, 1, 0.05)
    w = svl.workloads(replace(svl.QUICK, load_fractions=(fraction, 2 * fraction)), lengths,
                      cap)[0]
    raw = svl.scenario_dict(topo, true_profile, svl.QUICK, 16384)
    live, _ = svl.simulate_side(topo, raw, w, 12)
    other = true_profile
    if scale != 1.0:
        assert tmp is not None
        doc = yaml.safe_load(true_profile.read_text())
        for p in doc["prefill"]["points"]:
            p["time_s"] *= scale
        other = tmp / "shifted.yaml"
        other.write_text(yaml.safe_dump(doc))
    topo2 = replace(topo, policy_args={**topo.policy_args, "threshold_tokens": topo_t})
    sim, _ = svl.simulate_side(topo2, svl.scenario_dict(topo2, other, svl.QUICK, 16384), w, 12)
    return live, sim


def test_mape_and_agreement_are_zero_error_on_identical_worlds() -> None:
    live, sim = _sides()
    entry = svl.load_entry(0.5, live, sim)
    assert entry["ttft_mape"] == 0.0 and entry["route_agreement"] == 1.0
    assert entry["ttft_mape_by_live_route"] == {"prfaas": 0.0, "pd": 0.0}
    assert entry["throughput_live_rps"] == entry["throughput_sim_rps"] > 0
    assert 0 < entry["offload_live"] < 1  # both routes exercised


def test_negative_control_shifted_profile_gives_a_large_mape(tmp_path: Path) -> None:
    live, sim = _sides(scale=1.5, tmp=tmp_path)
    entry = svl.load_entry(0.5, live, sim)
    assert entry["ttft_mape"] > 0.3 and entry["ttft_bias"] > 0.3  # prefill is most of TTFT
    assert entry["route_agreement"] == 1.0  # the threshold policy ignores prefill speed
    assert min(entry["ttft_mape_by_live_route"].values()) > 0.1  # both routes prefill
    assert svl.verdict([entry])["ttft_mape"] is False


def test_negative_control_another_threshold_breaks_route_agreement() -> None:
    live, sim = _sides(topo_t=4096)
    entry = svl.load_entry(0.5, live, sim)
    # the t=4096 world keeps the 1K-4K prompts local that the t=1024 world offloads
    assert live.remote.sum() > sim.remote.sum() and entry["route_agreement"] < 0.95
    assert svl.verdict([entry])["route_agreement"] is False


def test_throughput_counts_completed_requests_over_the_span() -> None:
    side = svl.Side(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.5, 0.5, np.nan, 0.5]),
                    np.array([1.0, 2.0, np.nan, 4.0]), np.array([True, False, True, False]))
    assert svl.throughput_rps(side) == pytest.approx(3 / 4.0)
    with pytest.raises(ConfigError):
        svl.route_agreement(side, replace(side, remote=side.remote[:2]))
    with pytest.raises(ConfigError, match="two positive loads"):
        svl.Options(requests=8, load_fractions=(0.5,))


def test_warmup_lengths_spread_over_both_routes() -> None:
    """The warm-up's lengths reach both prefill instances at the shipped threshold (1024):
    some below it, some at or above it, spread over the distribution."""
    lengths = svl.lengths_for(svl.QUICK, 4096)
    warm = svl.warmup_lengths(lengths, svl.QUICK.warmup_requests)
    assert len(warm) == 8 and warm == sorted(warm) and len(set(warm)) == 8
    assert sum(n < 1024 for n in warm) >= 2 and sum(n >= 1024 for n in warm) >= 2
    assert lengths.lo <= warm[0] and warm[-1] <= lengths.hi
    assert svl.warmup_lengths(lengths, 0) == []
    with pytest.raises(ConfigError, match="warmup_requests"):
        replace(svl.QUICK, warmup_requests=-1)


LOAD_KEYS = {"offered_rps", "requests", "ttft_mape", "throughput_live_rps",
             "throughput_sim_rps", "route_agreement"}


def _rounding(live: np.ndarray, sim: np.ndarray, ok: np.ndarray) -> float:
    """How far a MAPE recomputed from the per-request times (rounded to 1e-4 s in the file)
    can be from the one computed before rounding (rounded to 4 decimals): each |sim - live| /
    live moves by at most (h + h sim / live) / (live - h), h = 5e-5 s, plus 5e-5 for the
    stated figure's own rounding. A fixed 2e-4 was too tight for 0.08 s TTFTs."""
    h = 5e-5
    lv, sv = live[ok], np.abs(sim[ok])
    return float(np.mean((h + h * sv / lv) / (lv - h))) + h


@pytest.mark.parametrize("name", ["sim_vs_live_vllm.json", "sim_vs_live_vllm_shared_run2.json",
                                  "sim_vs_live_vllm_shared_run3.json",
                                  "sim_vs_live_vllm_main_run1.json",
                                  "sim_vs_live_vllm_main_run2.json",
                                  "sim_vs_live_vllm_main_run3.json",
                                  "sim_vs_live_vllm_router_pinned_run1.json",
                                  "sim_vs_live_vllm_router_pinned_run2.json",
                                  "sim_vs_live_vllm_router_cores_run1.json",
                                  "sim_vs_live_vllm_router_cores_run2.json",
                                  "sim_vs_live_vllm_router_cores_run3.json",
                                  "sim_vs_live_vllm_deployed_profile_run1.json",
                                  "sim_vs_live_vllm_deployed_profile_run2.json",
                                  "sim_vs_live_vllm_deployed_profile_run3.json",
                                  "sim_vs_live_vllm_standalone_same_day_run1.json",
                                  "sim_vs_live_vllm_standalone_same_day_run2.json",
                                  "sim_vs_live_vllm_warmup_loads_run1.json",
                                  "sim_vs_live_vllm_warmup_loads_run2.json",
                                  "sim_vs_live_vllm_warmup_loads_run3.json",
                                  "sim_vs_live_vllm_warm_run1.json",
                                  "sim_vs_live_vllm_warm_run2.json",
                                  "sim_vs_live_vllm_warm_run3.json",
                                  "sim_vs_live_vllm_idle_on_deployment_run1.json",
                                  "sim_vs_live_vllm_idle_on_deployment_run2.json",
                                  "sim_vs_live_vllm_idle_on_deployment_run3.json",
                                  "sim_vs_live_vllm_after_series_run1.json",
                                  "sim_vs_live_vllm_after_series_run2.json",
                                  "sim_vs_live_vllm_fifo_link_run1.json",
                                  "sim_vs_live_vllm_fifo_link_run2.json",
                                  "sim_vs_live_vllm_fifo_link_run3.json",
                                  "sim_vs_live_vllm_shared_core_capacity_check.json",
                                  "sim_vs_live_vllm_spin_run1.json",
                                  "sim_vs_live_vllm_spin_run2.json",
                                  "sim_vs_live_vllm_spin_run3.json",
                                  "sim_vs_live_vllm_before_spin.json",
                                  "sim_vs_live_vllm_before_pin.json",
                                  "sim_vs_live_vllm_before_burst.json",
                                  "sim_vs_live_vllm_run2.json", "sim_vs_live_native.json",
                                  "sim_vs_live_native_before_burst.json",
                                  "sim_vs_live_native_rerun.json",
                                  "sim_vs_live_native_rerun_before.json"])
def test_committed_results_follow_the_schema_and_recompute(name: str) -> None:
    path = RESULTS / name
    assert path.exists(), f"{name}: the docs quote it, so it must be committed"
    r = json.loads(path.read_text())
    assert r["engine"] in ("vllm", "native") and r["profile"]["prefill"]["points"]
    assert len(r["loads"]) >= 2
    for load in r["loads"]:
        assert set(load) >= LOAD_KEYS
        pr = load["per_request"]
        live = np.array([np.nan if v is None else v for v in pr["ttft_live_s"]])
        sim = np.array([np.nan if v is None else v for v in pr["ttft_sim_s"]])
        ok = np.isfinite(live) & np.isfinite(sim)
        assert load["ttft_mape"] == pytest.approx(
            float(np.mean(np.abs(sim[ok] - live[ok]) / live[ok])), abs=_rounding(live, sim, ok))
        agree = np.mean(np.array(pr["remote_live"]) == np.array(pr["remote_sim"]))
        assert load["route_agreement"] == pytest.approx(agree, abs=1e-4)
        if "ttft_sim_without_core_sharing_s" in pr:  # runs with shared cores modelled
            alt = np.array([np.nan if v is None else v
                            for v in pr["ttft_sim_without_core_sharing_s"]])
            ok = np.isfinite(live) & np.isfinite(alt)
            assert load["ttft_mape_without_core_sharing"] == pytest.approx(
                float(np.mean(np.abs(alt[ok] - live[ok]) / live[ok])),
                abs=_rounding(live, alt, ok))


def test_run_writes_the_schema_end_to_end_with_a_stand_in_live_world(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """svl.run with the deployment replaced by the simulator on a 1.5x slower profile (the
    real live side is the benchmark's): every documented key, per-request arrays that
    recompute the load's figures, and a failing TTFT verdict for the shifted world."""
    import contextlib

    import prfaas.experiments.runs as runs

    topo = load_topology()
    true_profile = profile_path("cpu-tiny").resolve()
    doc = yaml.safe_load(true_profile.read_text())
    for p in doc["prefill"]["points"]:
        p["time_s"] *= 1.5
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(doc))
    raw_slow = svl.scenario_dict(topo, slow, svl.QUICK, 16384)

    def fake_live(url: str, model: str, w: object, vocab: int, seed: int
                  ) -> tuple[svl.Side, dict[str, object]]:
        side, _ = svl.simulate_side(topo, raw_slow, w, 12)  # type: ignore[arg-type]
        n = side.arrival_s.size
        return side, {"errors": 0, "error_samples": [], "retried": 0,
                      "loadavg_1m_before_after": [0.0, 0.0], "offloaded_kv": [],
                      "kv_bytes": [0] * n, "prefill_s": [None] * n,
                      "router_overhead_s": [None] * n}

    monkeypatch.setattr(runs, "deployed", lambda *a, **k: contextlib.nullcontext(
        type("Dep", (), {"url": "http://stand-in"})()))
    monkeypatch.setattr(svl, "live_side", fake_live)
    monkeypatch.setattr(svl, "served_model", lambda url: "tiny")
    warmed: list[list[int]] = []

    def fake_warm_up(url: str, model: str, lengths: list[int], *a: object) -> list[object]:
        warmed.append(lengths)
        return [{"length_tokens": n, "ok": True, "route": "pd" if n < 1024 else "prfaas",
                 "ttft_s": 0.1, "prefill_s": 0.1} for n in lengths]

    monkeypatch.setattr(idle_routes, "warm_up", fake_warm_up)
    measured: list[str] = []

    def fake_idle_points(url: str, *a: object) -> list[dict[str, object]]:
        measured.append(url)
        return [{"route": "pd", "length_tokens": 256, "ttft_s": 10.0}]

    monkeypatch.setattr(svl, "deployment_idle_points", fake_idle_points)
    off = svl.run(topo, true_profile, replace(svl.QUICK, requests=12,
                                              idle_points_on_deployment=False), tmp_path)
    assert off["idle_points_source"] == "profile" and not measured
    options = replace(svl.QUICK, requests=12)
    result = svl.run(topo, true_profile, options, tmp_path)
    assert measured == ["http://stand-in"] and result["idle_points_source"] == "deployment"
    assert [p["length_tokens"] for p in result["idle_points"]] == [256]
    assert result["route_overhead_s"]["pd"] > 9.0  # the deployment's point, not the profile's
    assert [len(w) for w in warmed] == [options.warmup_requests] * 2  # once per run
    assert [p["length_tokens"] for p in result["warmup"]["points"]] == warmed[1]
    assert result["engine"] == "native" and result["profile"]["name"] == "cpu-tiny"
    assert [x["offered_rps"] for x in result["loads"]] == sorted(
        x["offered_rps"] for x in result["loads"])
    for load in result["loads"]:
        assert set(load) >= LOAD_KEYS and load["requests"] == 12
        assert load["ttft_mape"] > 0.2 and load["route_agreement"] == 1.0
    assert result["meets_goal"]["ttft_mape"] is False
    json.dumps(result)  # serializable as written


def test_cli_refuses_incomplete_requests_in_one_line(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        main(["profile", "--engine", "vllm"])
    assert done.value.code == 2 and "--topology" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["sim-vs-live", "--loads", "0.5", "--profile", str(profile_path("cpu-tiny")),
              "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "two positive loads" in err and err.count("\n") == 1


def _lone_profile(tmp: Path, offsets_s: dict[str, float]) -> tuple[Path, list[float]]:
    """The committed CPU profile with idle points whose TTFTs are the simulator's own for each
    lone request plus a known offset per route; also returns those simulated TTFTs."""
    topo = load_topology()
    base = profile_path("cpu-tiny").resolve()
    lengths = [256, 512, 1024, 2048, 4096]
    n = len(lengths)
    lone = svl.Workload(np.arange(n, dtype=np.float64) * svl.IDLE_GAP_S,
                        np.array(lengths, dtype=np.int64), np.full(n, 4, dtype=np.int64), "t")
    side, _ = svl.simulate_side(topo, svl.scenario_dict(topo, base, svl.QUICK, 16384), lone, 12)
    doc = yaml.safe_load(base.read_text())
    doc["idle_ttft"] = {"how": "test", "points": [
        {"route": "prfaas" if r else "pd", "length_tokens": n_tok,
         "ttft_s": float(t) + offsets_s["prfaas" if r else "pd"]}
        for n_tok, t, r in zip(lengths, side.ttft_s, side.remote, strict=True)]}
    path = tmp / "with_idle.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, [float(t) for t in side.ttft_s]


def test_idle_points_give_each_route_its_measured_overhead(tmp_path: Path) -> None:
    topo = load_topology()
    path, _ = _lone_profile(tmp_path, {"pd": 0.04, "prfaas": 0.11})
    raw = svl.scenario_dict(topo, path, svl.QUICK, 16384)
    idle = svl.idle_overheads(topo, raw, path, 12)
    assert idle["route_overhead_s"] == pytest.approx({"pd": 0.04, "prfaas": 0.11}, abs=1e-5)
    # negative control: the profile without idle points has no overhead at all
    bare = profile_path("cpu-tiny").resolve()
    assert svl.idle_overheads(topo, svl.scenario_dict(topo, bare, svl.QUICK, 16384), bare,
                              12)["route_overhead_s"] == {}
    # a point the simulator routes the other way is refused, not averaged in
    doc = yaml.safe_load(path.read_text())
    doc["idle_ttft"]["points"][0]["route"] = "prfaas"  # 256 tokens stay local at t=1024
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="routed this idle point elsewhere"):
        svl.idle_overheads(topo, raw, wrong, 12)


def test_route_overheads_shift_only_the_first_token_of_their_route() -> None:
    topo = load_topology()
    raw = svl.scenario_dict(topo, profile_path("cpu-tiny").resolve(), svl.QUICK, 16384)
    lengths = svl.lengths_for(svl.QUICK, 16384)
    w = svl.workloads(svl.QUICK, lengths, 1.0)[1]
    plain, _ = svl.simulate_side(topo, raw, w, 12)
    shifted, cfg = svl.simulate_side(topo, raw, w, 12, {"pd": 0.05, "prfaas": 0.2})
    assert cfg["local_overhead_s"] == 0.05 and cfg["remote_overhead_s"] == 0.2
    expect = np.where(plain.remote, 0.2, 0.05)
    assert plain.remote.any() and (~plain.remote).any()
    assert np.allclose(shifted.ttft_s - plain.ttft_s, expect, rtol=0, atol=1e-9)
    assert np.array_equal(shifted.finish_s, plain.finish_s)  # it occupies no instance
    assert np.array_equal(shifted.remote, plain.remote)


def test_idle_points_are_read_with_a_clear_error_on_a_bad_one(tmp_path: Path) -> None:
    from prfaas.models.profile_file import idle_ttft_points

    path, _ = _lone_profile(tmp_path, {"pd": 0.0, "prfaas": 0.0})
    assert [p["route"] for p in idle_ttft_points(path)][:1] == ["pd"]
    doc = yaml.safe_load(path.read_text())
    doc["idle_ttft"]["points"][1] = {"route": "pd", "ttft_s": 0.1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="length_tokens"):
        idle_ttft_points(bad)
    load_profile_file(path)  # the planner's reader accepts the section


def test_topology_cores_become_the_simulators_shared_groups(tmp_path: Path) -> None:
    from prfaas.serve.cores import shared_core_groups

    vtopo = load_topology(str(Path(__file__).parents[2] / "topologies" / "vllm-local.yaml"))
    bare = profile_path("cpu-tiny").resolve()
    sharing = svl.core_sharing(vtopo, bare)
    assert sharing["groups"] == [["prfaas-0", "pdp-0"]]  # both pinned to core 0
    assert sharing["sim_groups"] == [["prfaas-p0000", "pd-p0000"]]
    assert sharing["factor"] == 2.0 and "default" in sharing["factor_source"]
    doc = yaml.safe_load(bare.read_text())
    doc["core_sharing"] = {"how": "test", "factor": 1.7, "points": []}
    measured = tmp_path / "measured.yaml"
    measured.write_text(yaml.safe_dump(doc))
    assert svl.core_sharing(vtopo, measured)["factor"] == 1.7
    doc["core_sharing"]["factor"] = 0.4  # a speed-up is no measurement of sharing
    measured.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"core_sharing\.factor"):
        svl.core_sharing(vtopo, measured)
    # negative control: the native topology pins nothing, so nothing is shared
    topo = load_topology()
    assert svl.core_sharing(topo, measured)["sim_groups"] == []
    ws = [type("W", (), {"name": n, "cores": c})() for n, c in
          (("a", "0-1"), ("b", "2"), ("c", "1"), ("d", None), ("e", "3"), ("f", "3"))]
    assert shared_core_groups(ws) == [("a", "c"), ("e", "f")]


def test_shared_cores_slow_only_overlapping_prefills_in_sim_vs_live() -> None:
    topo = load_topology()
    pinned = replace(topo, workers=tuple(
        replace(w, cores="0" if w.role in ("prfaas", "pd-p") else "1") for w in topo.workers))
    raw = svl.scenario_dict(topo, profile_path("cpu-tiny").resolve(), svl.QUICK, 16384)
    w = svl.workloads(svl.QUICK, svl.lengths_for(svl.QUICK, 16384), 1.0)[1]
    sharing = svl.core_sharing(pinned, None)
    assert sharing["sim_groups"] and sharing["factor"] == 2.0
    plain, cfg0 = svl.simulate_side(topo, raw, w, 12)
    shared, cfg = svl.simulate_side(pinned, raw, w, 12, sharing=sharing)
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

    profile = profile_path("cpu-tiny").resolve()
    for topo, order, link_type, released in (
            (_vllm_local(hybrid), "fifo", FifoLink, True),
            (load_topology(), "shared", SharedLink, False)):
        raw = svl.scenario_dict(topo, profile, svl.QUICK, 4096)
        assert raw["link"]["order"] == order
        cfg = build_system(parse_scenario(raw), "prfaas_pd", threshold_tokens=1024)
        w = svl.workloads(svl.QUICK, svl.lengths_for(svl.QUICK, 4096), 1.0)[0]
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
    from prfaas.models.profile_file import load_profile_file
    from prfaas.planner.throughput import mean_service_s

    profile = profile_path("cpu-tiny").resolve()
    lengths = svl.lengths_for(svl.QUICK, 16384)
    prefill = load_profile_file(profile).prefill
    assert prefill is not None
    one_core = 1.0 / mean_service_s(lengths, prefill, "exact")
    alone = svl.planner_capacity_rps(lengths, profile, 1024, 1, 1, 100.0)
    for factor in (2.0, 1.5):
        sharing = {"sim_groups": [["prfaas-p0000", "pd-p0000"]], "factor": factor}
        shared = svl.shared_core_capacity_rps(lengths, profile, 1024, 1, 1, sharing)
        assert shared == pytest.approx(one_core * 2.0 / factor, rel=1e-9)
        assert svl.planner_capacity_rps(lengths, profile, 1024, 1, 1, 100.0, sharing) == \
            pytest.approx(min(alone, shared), rel=1e-12)
    assert alone > one_core  # here the shared core is what binds
    # nothing shared: no bound, the planner's figure unchanged
    assert svl.shared_core_capacity_rps(lengths, profile, 1024, 1, 1, {"sim_groups": []}) \
        is None


def test_a_committed_run_replays_its_own_workloads_and_refuses_another() -> None:
    """The re-simulation scripts rebuild a run's workloads from its JSON (same seed, lengths,
    arrivals); a run whose recorded lengths differ (here one edited) is refused."""
    doc = json.loads((RESULTS / "sim_vs_live_vllm_release_run1.json").read_text())
    options, loads = svl.replay_workloads(doc, 4096)
    assert options.load_fractions == tuple(doc["options"]["load_fractions"])
    for w, entry in zip(loads, doc["loads"], strict=True):
        assert [int(x) for x in w.input_tokens] == entry["per_request"]["input_tokens"]
        assert w.input_tokens.size == entry["requests"]
    doc["loads"][1]["per_request"]["input_tokens"][3] += 1
    with pytest.raises(ConfigError, match="not the run's"):
        svl.replay_workloads(doc, 4096)
