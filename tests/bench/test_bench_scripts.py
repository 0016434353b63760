"""Every benchmarks/*.py is listed once in benchmarks/README.md, and each listed one runs.

The README's table gives each file a kind. A script (benchmark, check, tool) must answer
`--help` with exit 0 and an argparse usage line, which it prints without running the
benchmark; a library must import; a plugin (loaded by vLLM instances, importing vLLM's NIXL
connector) must compile. Each file runs in its own interpreter with PYTHONPATH = src and
benchmarks, as the README says to run them, several at once.
The negative controls feed the same checks a README missing a script and naming a gone one,
a script that ignores --help and runs, and one that fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
README = BENCH / "README.md"
ROW_RE = re.compile(r"^\|\s*`([\w.]+\.py)`\s*\|\s*(\w+)\s*\|", re.MULTILINE)
KINDS = {"benchmark", "check", "tool", "library", "plugin"}
TIMEOUT_S = 180


def listed(text: str) -> dict[str, str]:
    """File name -> kind for every row of the README's table; a name listed twice is an error."""
    rows: dict[str, str] = {}
    for m in ROW_RE.finditer(text):
        name, kind = m.group(1), m.group(2)
        if name in rows:
            raise ValueError(f"{name} listed twice")
        rows[name] = kind
    return rows


def listing_problems(rows: dict[str, str], files: set[str]) -> list[str]:
    bad = [f"{name}: not in benchmarks/README.md" for name in sorted(files - set(rows))]
    bad += [f"{name}: listed but not in benchmarks/" for name in sorted(set(rows) - files)]
    bad += [f"{name}: unknown kind {kind!r}" for name, kind in sorted(rows.items())
            if kind not in KINDS]
    return bad


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(BENCH),
                                         env.get("PYTHONPATH", "")])
    env.update(RAY_USAGE_STATS_ENABLED="0", VLLM_NO_USAGE_STATS="1")
    return env


def problem(path: Path, kind: str) -> str | None:
    """None when the file does what its kind promises, else what went wrong."""
    if kind == "library":
        cmd = [sys.executable, "-c", f"import {path.stem}"]
    elif kind == "plugin":
        cmd = [sys.executable, "-m", "py_compile", str(path)]
    else:
        cmd = [sys.executable, str(path), "--help"]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"{path.name} ({kind}): no answer in {TIMEOUT_S} s"
    if done.returncode != 0:
        return f"{path.name} ({kind}): exit {done.returncode}: {done.stderr.strip()[-400:]}"
    if kind not in ("library", "plugin") and "usage:" not in done.stdout:
        return f"{path.name} ({kind}): --help printed no usage line (does it run instead?)"
    return None


def test_every_benchmark_file_is_listed_once() -> None:
    rows = listed(README.read_text())
    files = {p.name for p in BENCH.glob("*.py")}
    assert len(files) >= 20, "the glob found too few scripts"  # a vacuous pass otherwise
    assert listing_problems(rows, files) == []


def test_every_listed_file_runs() -> None:
    rows = listed(README.read_text())
    with ThreadPoolExecutor(max_workers=4) as pool:
        found = list(pool.map(lambda item: problem(BENCH / item[0], item[1]), sorted(rows.items())))
    bad = [p for p in found if p is not None]
    assert not bad, "\n".join(bad)


def test_a_missing_or_gone_listing_is_reported() -> None:
    text = "| `a.py` | benchmark | x |\n| `gone.py` | tool | y |\n| `c.py` | toy | z |\n"
    assert listing_problems(listed(text), {"a.py", "b.py", "c.py"}) == [
        "b.py: not in benchmarks/README.md", "gone.py: listed but not in benchmarks/",
        "c.py: unknown kind 'toy'"]
    with pytest.raises(ValueError, match="listed twice"):
        listed("| `a.py` | tool | x |\n| `a.py` | tool | y |\n")


def test_a_script_that_runs_instead_of_helping_or_fails_is_reported(tmp_path: Path) -> None:
    runs = tmp_path / "runs.py"
    runs.write_text("print('measuring...')\n")
    fails = tmp_path / "fails.py"
    fails.write_text("import sys\nsys.exit(3)\n")
    helps = tmp_path / "helps.py"
    helps.write_text("import argparse\nargparse.ArgumentParser(description='x').parse_args()\n")
    assert "printed no usage line" in (problem(runs, "benchmark") or "")
    assert "exit 3" in (problem(fails, "tool") or "")
    assert "exit 1" in (problem(tmp_path / "nope.py", "library") or "")
    assert problem(helps, "check") is None
