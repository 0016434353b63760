"""The skip rules (tests/needs.py, tests/conftest.py), run on small suites in a subprocess.

A feature made missing here by PATH (no `ip`, no `tc`): its test skips, naming it, unless
PRFAAS_REQUIRE lists it, and then fails in one line saying which feature and why. A skip made
anywhere else fails whenever PRFAAS_REQUIRE is set. The control: the same netns test passes
where the feature is here (it is asked for with `needs`, like any other).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from needs import needs

HERE = Path(__file__).resolve().parent
SUITE = {
    "test_a.py": """
from needs import needs

@needs("netns")
def test_uses_a_namespace():
    assert True
""",
    "test_b.py": """
import pytest

def test_skips_by_itself():
    pytest.skip("decided by what the test measured")
""",
    "test_c.py": """
import pytest
missing = pytest.importorskip("a_module_nobody_installed")

def test_never_collected():
    pass
""",
}


def _run(tmp_path: Path, files: list[str], require: str | None, path: str) -> tuple[int, str]:
    for name in ("conftest.py", "needs.py"):
        shutil.copy(HERE / name, tmp_path / name)
    for name in files:
        (tmp_path / name).write_text(SUITE[name])
    env = {k: v for k, v in os.environ.items() if k != "PRFAAS_REQUIRE"}
    env["PATH"] = path
    if require is not None:
        env["PRFAAS_REQUIRE"] = require
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                           "-o", "addopts=", *files], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


NO_TOOLS = str(Path(sys.executable).parent)  # python's folder: no `ip`, no `tc`


def test_a_missing_feature_skips_saying_so(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, ["test_a.py"], None, NO_TOOLS)
    assert rc == 0 and "1 skipped" in out, out
    assert "[needs netns] ip and tc not on PATH" in out, out


def test_a_missing_required_feature_fails_in_one_line(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, ["test_a.py"], "netns,vllm", NO_TOOLS)
    assert rc == 1 and "1 error" in out, out  # failed at setup, before the test body
    line = ("required feature 'netns' is missing: ip and tc not on PATH (iproute2) "
            "(PRFAAS_REQUIRE=netns,vllm)")
    assert line in out, out


@needs("netns")
def test_the_same_test_passes_where_the_feature_is_here(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, ["test_a.py"], "netns", os.environ["PATH"])
    assert rc == 0 and "1 passed" in out, out


def test_any_other_skip_fails_when_features_are_required(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, ["test_b.py", "test_c.py"], None, NO_TOOLS)
    assert rc == 0 and "2 skipped" in out, out  # unrequired: skips as before
    rc, out = _run(tmp_path, ["test_b.py"], "cpus2", NO_TOOLS)
    assert rc == 1 and "1 failed" in out, out
    assert "skipped outside tests/needs.py while PRFAAS_REQUIRE is set" in out, out
    rc, out = _run(tmp_path, ["test_c.py"], "cpus2", NO_TOOLS)  # a collection error stops pytest
    assert rc == 2 and "1 error" in out, out
    assert "module skipped outside tests/needs.py" in out, out


def test_an_unknown_required_feature_is_a_usage_error(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, ["test_a.py"], "netns,gpu", NO_TOOLS)
    assert rc == 4 and "unknown feature(s) gpu" in out, out


@pytest.mark.parametrize("caps, why", [(0, "no CAP_NET_ADMIN and CAP_SYS_ADMIN"),
                                       (1 << 12, "no CAP_SYS_ADMIN"), (1 << 12 | 1 << 21, None)])
def test_netns_is_decided_by_the_capabilities(monkeypatch: pytest.MonkeyPatch, caps: int,
                                              why: str | None) -> None:
    import needs as module

    monkeypatch.setattr(module, "_effective_caps", lambda: caps)
    monkeypatch.setattr(module.shutil, "which", lambda tool: f"/sbin/{tool}")
    got = module._netns()
    assert got == why if why is None else got is not None and got.startswith(why)
