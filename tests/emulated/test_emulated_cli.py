"""Bad input to the emulated commands: one line on stderr, exit code 2, nothing started."""

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_scenario import write_scenario

PRFAAS = [sys.executable, "-m", "prfaas"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PRFAAS, *args], capture_output=True, text=True, timeout=120)


def _one_line_exit_2(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in out.stderr


def test_unknown_system(tmp_path: Path) -> None:
    _one_line_exit_2(run("serve", "--scenario", "paper-case-study", "--system", "all_h200"),
                     "all_h200")


def test_scenario_without_a_decode_profile_for_a_role(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, decode=False)
    _one_line_exit_2(run("serve", "--scenario", str(path), "--system", "prfaas_pd",
                         "--scales", "output=4"),
                     "hardware.slow.decode")


@pytest.mark.parametrize(("scales", "needle"), [
    ("output=3", "scales.output"), ("tokens=1000", "scales.tokens"),
    ("bytes=1e-9", "scales.bytes"), ("time=0", "scales.time"), ("speed=2", "scales.speed"),
    ("time", "--scales"),
])
def test_scales_that_cannot_preserve_the_ratios(scales: str, needle: str) -> None:
    _one_line_exit_2(run("reproduce", "--live", "--quick", "--scales", scales), needle)


def test_unknown_scenario_and_both_sources() -> None:
    _one_line_exit_2(run("reproduce", "--live", "--scenario", "no-such-scenario"),
                     "no-such-scenario")
    _one_line_exit_2(run("serve", "--scenario", "paper-case-study", "--topology", "x.yaml"),
                     "--topology")


@pytest.mark.parametrize(("args", "needle"), [
    (("--live", "--outage", "prfaas@600+120"), "only the inter-DC link"),
    (("--live", "--outage", "link@60+120"), "START must be >= DURATION"),
    (("--live", "--outage", "link@600"), "NAME@START+DURATION"),
    (("--live", "--outage", "link@600+120", "--load", "0"), "--load"),
    (("--outage", "link@600+120"), "needs --live"),
])
def test_bad_live_outages(args: tuple[str, ...], needle: str) -> None:
    _one_line_exit_2(run("reproduce", *args), needle)
