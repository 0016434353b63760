"""Profiles: the Table 5 fit, cached-prefix charging, roofline and measured profile files."""

from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.catalog import find_model
from prfaas.models.profile import DecodeTime, PrefillTime
from prfaas.models.profile_file import load_profile_file
from prfaas.models.roofline import roofline_profile
from prfaas.scenario import load_scenario


def test_table5_fit_matches_the_papers_coefficients() -> None:
    fit = PrefillTime.fit([1024, 8192, 32768, 131072], [0.44, 0.72, 1.84, 7.40])
    assert fit.c2 == pytest.approx(9.476e-11, rel=1e-3)
    assert fit.c1 == pytest.approx(4.107e-5, rel=1e-3)
    assert fit.c0 == pytest.approx(0.389, rel=1e-3)


def test_cached_prefix_is_charged_only_for_new_tokens() -> None:
    t = PrefillTime(1e-10, 1e-5, 0.3)
    full = t.seconds(10000)
    assert t.seconds(10000, 0) == pytest.approx(full)
    tail = t.seconds(10000, 8000)
    assert t.c0 < tail < full
    # attention of the new tokens still spans the cached prefix: more than a fresh 2000
    assert tail > t.seconds(2000)


def test_h20_derivation_reproduces_table6_implied_times() -> None:
    s = load_scenario("paper-case-study")
    h20 = s.hardware["h20"].require_prefill()
    assert h20.seconds(27500) == pytest.approx(9 / 2.11, rel=0.03)
    assert h20.seconds(10200) == pytest.approx(3 / 1.64, rel=0.03)
    assert s.hardware["h20"].require_decode().requests_per_s(1024) == pytest.approx(0.78, rel=0.01)


def test_roofline_orders_hardware_by_compute() -> None:
    spec = find_model("Qwen3-Next-80B-A3B")
    b200 = roofline_profile(spec, "B200").require_prefill()
    h20 = roofline_profile(spec, "H20").require_prefill()
    assert b200.seconds(32768) < h20.seconds(32768)
    assert b200.c2 > 0 and b200.c1 > 0
    with pytest.raises(ConfigError, match="gpu"):
        roofline_profile(spec, "TPU-v9")


def test_decode_interpolates_by_batch() -> None:
    d = DecodeTime(32, 0.02, ((1, 0.01), (32, 0.02)))
    assert d.step_at(1) == 0.01 and d.step_at(32) == 0.02
    assert 0.01 < d.step_at(16) < 0.02


def test_profile_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: cpu-test\ngpus_per_instance: 1\n"
        "prefill: {points: [{length_tokens: 256, time_s: 0.02}, {length_tokens: 1024, "
        "time_s: 0.09}, {length_tokens: 4096, time_s: 0.5}]}\n"
        "kv: {points: [{length_tokens: 256, bytes: 1300000}, {length_tokens: 4096, "
        "bytes: 2060000}]}\n"
        "decode: {bs_max: 8, step_points: [{batch: 1, step_s: 0.004}, {batch: 8, step_s: 0.01}]}\n")
    prof = load_profile_file(path)
    assert prof.require_prefill().seconds(1024) == pytest.approx(0.09, rel=0.1)
    assert prof.kv.bytes_for(4096) == pytest.approx(2060000, rel=1e-6)
    assert prof.require_decode().bs_max == 8 and prof.require_decode().step_at(8) == 0.01
    path.write_text("name: x\nprefill: {points: [{length_tokens: 1}]}\nbogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_profile_file(path)


def test_scenario_hardware_from_profile_file_uses_its_key(tmp_path: Path) -> None:
    """Pools (and the default baselines) refer to hardware by the scenario's key, whatever
    name the profile file gives itself."""
    from prfaas.scenario import parse_scenario

    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: some-cpu\ngpus_per_instance: 1\n"
        "prefill: {points: [{length_tokens: 256, time_s: 0.02}, {length_tokens: 1024, "
        "time_s: 0.09}, {length_tokens: 4096, time_s: 0.5}]}\n"
        "kv: {points: [{length_tokens: 256, bytes: 1300000}, {length_tokens: 4096, "
        "bytes: 2060000}]}\n"
        "decode: {bs_max: 8, step_points: [{batch: 1, step_s: 0.004}, {batch: 8, step_s: 0.01}]}\n")
    s = parse_scenario({
        "name": "cpu", "kv": {"profile": str(prof)}, "hardware": {"cpu": {"profile": str(prof)}},
        "clusters": {"prfaas": {"hardware": "cpu", "instances": 1},
                     "pd": {"hardware": "cpu", "instances": 2}},
        "link": {"gbps": 0.05},
        "workload": {"input": {"dist": "lognormal", "mu": 7.0, "sigma": 1.0, "min_tokens": 64,
                               "max_tokens": 8000}, "output_tokens": 16}})
    assert s.homogeneous.hardware.name == "cpu" and s.homogeneous.instances == 3
    assert s.naive_prefill.hardware.name == "cpu"
