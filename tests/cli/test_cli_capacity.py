"""`prfaas capacity --ray` refuses what it cannot run on Ray: a scenario with several PD
clusters searches locally only, so asking for Ray is one line on stderr and exit code 2 (it
used to run locally without a word). The control: the same scenario without --ray gets past
that check and runs its search."""

from __future__ import annotations

import subprocess
import sys

PRFAAS = [sys.executable, "-m", "prfaas"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PRFAAS, *args], capture_output=True, text=True, timeout=300)


def test_capacity_on_ray_refuses_a_multi_cluster_scenario() -> None:
    out = run("capacity", "--scenario", "two-regions", "--ray", "127.0.0.1:1", "--json")
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray" in lines[0] and "several PD clusters" in lines[0], lines
    assert out.stdout == "" and "Traceback" not in out.stderr


def test_the_same_scenario_runs_locally() -> None:
    out = run("capacity", "--scenario", "two-regions", "--requests", "200", "--json")
    assert out.returncode == 0, out.stderr
    assert "several PD clusters" not in out.stderr and '"max_rps_of"' in out.stdout
