"""Start-up stays light: the planning/simulation commands import neither scipy.stats nor
scipy.optimize, matplotlib, torch, aiohttp or (with --json) rich. Each check runs in a fresh
interpreter, since this test process has imported most of them already."""

import json
import subprocess
import sys

import pytest

HEAVY = ("scipy.stats", "scipy.optimize", "scipy.linalg", "matplotlib", "torch", "aiohttp")
ALLOWED = {"scipy.optimize._slsqplib"}  # the one compiled solver models/nnls.py loads alone


def _modules_after(code: str) -> set[str]:
    script = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _heavy(modules: set[str], extra: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in modules - ALLOWED
                  if any(m == h or m.startswith(h + ".") for h in HEAVY + extra))


def test_importing_the_commands_pulls_no_heavy_module() -> None:
    modules = _modules_after("import prfaas.cli, prfaas.cli.simulate, prfaas.cli.plan, "
                             "prfaas.cli.capacity")
    assert "prfaas.cli.simulate" in modules  # the probe itself works
    assert _heavy(modules, ("rich",)) == []


@pytest.mark.parametrize("argv", [
    ["plan", "--scenario", "paper-case-study", "--json"],
    ["simulate", "--scenario", "paper-case-study", "--requests", "200", "--json"],
])
def test_running_a_json_command_pulls_no_heavy_module(argv: list[str]) -> None:
    code = ("import contextlib, io\nfrom prfaas.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})")
    modules = _modules_after(code)
    assert "prfaas.planner.search" in modules
    assert _heavy(modules, ("rich",)) == []
