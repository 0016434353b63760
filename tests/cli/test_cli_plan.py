"""The analytical CLI commands end to end, in a subprocess: outputs and bad-input handling."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PRFAAS = [sys.executable, "-m", "prfaas"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PRFAAS, *args], capture_output=True, text=True, timeout=120)


def test_plan_json_keys_and_figures() -> None:
    out = run("plan", "--scenario", "paper-case-study", "--json")
    assert out.returncode == 0, out.stderr
    systems = json.loads(out.stdout)["systems"]
    prf = systems["prfaas_pd"]
    for key in ("lambda_max", "n_prfaas", "n_p", "n_d", "theta_prfaas", "theta_pd_p",
                "theta_pd_d", "threshold_tokens", "offload_fraction", "l_long_tokens",
                "l_short_tokens", "egress_gbps", "ttft_mean_s", "ttft_p90_s"):
        assert key in prf
    assert systems["homogeneous_pd"]["theta_prfaas"] is None
    assert systems["naive_heterogeneous"]["theta_pd_p"] is None
    assert abs(prf["lambda_max"] / 3.24 - 1) < 0.04


def test_plan_plot_writes_two_pngs(tmp_path: Path) -> None:
    out = run("plan", "--plot", str(tmp_path))
    assert out.returncode == 0, out.stderr
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) == 2
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


@pytest.mark.parametrize(("args", "expected"), [
    (("bandwidth", "--model", "MiniMax-M2.5", "--gpus", "512", "--length", "32K"), 3800),
    (("bandwidth", "--model", "Qwen3-235B", "--gpus", "512", "--length", "32K"), 2100),
    (("bandwidth", "--model", "Ring-2.5-1T", "--gpus", "512", "--length", "32K"), 170),
    (("bandwidth", "--model", "Ring-2.5-1T", "--gpus", "10000", "--length", "128K"), 1800),
])
def test_bandwidth_reproduces_section_2_3(args: tuple, expected: float) -> None:
    out = run(*args, "--json")
    assert out.returncode == 0, out.stderr
    assert abs(json.loads(out.stdout)["egress_gbps"] / expected - 1) < 0.05


def test_ring_at_128k_is_below_100_gbps() -> None:
    out = run("bandwidth", "--model", "Ring-2.5-1T", "--gpus", "512", "--length", "128K", "--json")
    assert json.loads(out.stdout)["egress_gbps"] < 100


def test_bandwidth_model_source_uses_geometry() -> None:
    out = run("bandwidth", "--model", "Qwen3-Next-80B-A3B", "--gpus", "64", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["source"] == "model" and data["egress_gbps"] > 0


def test_kv_json_and_lengths() -> None:
    out = run("kv", "--model", "DeepSeek-V3", "--lengths", "1K,8K,100", "--json")
    data = json.loads(out.stdout)
    assert data["kv_bytes_per_token"] == 61 * 576 * 2
    assert data["sizes_bytes"] == {"1024": 61 * 576 * 2 * 1024, "8192": 61 * 576 * 2 * 8192,
                                   "100": 61 * 576 * 2 * 100}


def _bad_spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("args", "needle"), [
    (("kv", "--model", "NoSuchModel"), "model='NoSuchModel'"),
    (("kv", "--model", "DeepSeek-V3", "--lengths", "12Q"), "--lengths='12Q'"),
    (("kv", "--model", "DeepSeek-V3", "--lengths", "-5"), "--lengths"),
    (("plan", "--scenario", "no-such-scenario"), "scenario='no-such-scenario'"),
    (("bandwidth", "--model", "NoSuchModel", "--gpus", "8"), "model='NoSuchModel'"),
    (("bandwidth", "--model", "Ring-2.5-1T", "--gpus", "0"), "gpus=0"),
])
def test_bad_input_is_one_line_exit_2(args: tuple, needle: str) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("spec", "needle"), [
    ("name: x\nlayers:\n  - {kind: gqa, count: 2, kv_heads: 4, k_head_dim: 8}\n", "v_head_dim"),
    ("name: x\nlayers:\n  - {kind: gqa, count: -2, kv_heads: 4, k_head_dim: 8, v_head_dim: 8}\n",
     "count=-2"),
    ("name: x\nlayers:\n  - {kind: rnn, count: 2}\n", "kind='rnn'"),
    ("name: x\nlayers: [\n", "not valid YAML"),
])
def test_malformed_spec_file_is_one_line_exit_2(tmp_path: Path, spec: str, needle: str) -> None:
    out = run("kv", "--model-file", _bad_spec(tmp_path, spec))
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr


def _scenario_with(tmp_path: Path, old: str, new: str) -> str:
    src = Path(__file__).resolve().parents[2] / "scenarios/paper-case-study.yaml"
    text = src.read_text()
    assert old in text
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("prfaas: {hardware: h200, instances: 4}", "prfaas: {hardware: h200, instances: 0}",
     "clusters.prfaas.instances=0"),
    ("gbps: 100 ", "gbps: 0 ", "link.gbps=0"),
])
def test_infeasible_scenario_exit_2(tmp_path: Path, old: str, new: str, needle: str) -> None:
    out = run("plan", "--scenario", _scenario_with(tmp_path, old, new))
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr
