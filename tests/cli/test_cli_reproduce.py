"""`prfaas reproduce` (the main job) end to end: figures, plots and the paper's ordering."""

import json
import subprocess
import sys
from pathlib import Path


def test_reproduce_writes_results_and_plots(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "prfaas", "reproduce", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Throughput plan" in out.stdout and "Simulation" in out.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    cap = {name: c["max_rps"] for name, c in results["capacity"].items()}
    exact = {name: p["lambda_max"] for name, p in results["planner"]["exact"].items()}
    for name in cap:
        assert abs(cap[name] / exact[name] - 1) < 0.03, (name, cap[name], exact[name])
    assert cap["prfaas_pd"] > cap["naive_heterogeneous"] > cap["homogeneous_pd"]
    sweep = results["load_sweep"]["homogeneous_pd"]
    # past its capacity a system's throughput stops following the offered load
    assert sweep[-1]["throughput_rps"] < 0.9 * sweep[-1]["offered_rps"]
    for png in results["plots"]:
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
