"""Bad certificates stay one clear line naming the file, exit code 2, no traceback: missing,
unreadable, not PEM, a key that does not match its certificate, an expired certificate. Also
`prfaas certs init` output and a bad API key. All certificates are minted in temp dirs."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prfaas.cli import main
from prfaas.security.certs import Authority, Member
from prfaas.security.tls import Identity

NAMES = ("prfaas-0", "pdp-0", "pdd-0", "router")


def _topology(tmp: Path, tls_dir: str = "certs") -> Path:
    path = tmp / "topo.yaml"
    path.write_text(yaml.safe_dump({
        "name": "bad-certs", "router": {"port": 0}, "security": {"tls": {"dir": tls_dir}},
        "workers": [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
                    {"name": "pdd-0", "role": "pd-d"}]}))
    return path


def _prfaas(*args: str, subprocess_run: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (fast), or as a real `python -m prfaas` (the entry point)."""
    if subprocess_run:
        return subprocess.run([sys.executable, "-m", "prfaas", *args], capture_output=True,
                              text=True, timeout=120)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A topology file and its certs/ made by the real `prfaas certs init` (relative dir)."""
    topo = _topology(tmp_path)
    proc = _prfaas("certs", "init", "--topology", str(topo), "--out", str(tmp_path / "certs"))
    assert proc.returncode == 0, proc.stderr
    assert "4 certificates" in proc.stdout
    for name in NAMES:
        Identity.load(tmp_path / "certs", name)  # all good as made
    assert oct((tmp_path / "certs" / "router.key").stat().st_mode & 0o777) == "0o600"
    return tmp_path


def _serve(tree: Path, subprocess_run: bool = False) -> subprocess.CompletedProcess[str]:
    return _prfaas("serve", "--topology", str(tree / "topo.yaml"), "--port", "0",
                   subprocess_run=subprocess_run)


def test_missing_certificate(tree: Path) -> None:
    (tree / "certs" / "pdd-0.pem").unlink()
    line = _one_line(_serve(tree), str(tree / "certs" / "pdd-0.pem"), "no such file")
    assert "not a PEM" not in line and line.count("pdd-0.pem") == 1, line


def test_unreadable_certificate(tree: Path) -> None:
    path = tree / "certs" / "router.pem"
    if os.geteuid() == 0:  # root reads any mode: make it something that cannot be read
        path.unlink()
        path.mkdir()
    else:
        path.chmod(0)
    _one_line(_serve(tree), str(path), "unreadable")


def test_certificate_that_is_not_pem(tree: Path) -> None:
    (tree / "certs" / "ca.pem").write_text("not a certificate\n")
    _one_line(_serve(tree), str(tree / "certs" / "ca.pem"), "not a PEM certificate")


def test_missing_key(tree: Path) -> None:
    (tree / "certs" / "pdp-0.key").unlink()
    line = _one_line(_serve(tree), str(tree / "certs" / "pdp-0.key"), "no such file")
    assert "not an unencrypted PEM key" not in line, line


def test_key_not_matching_its_certificate(tree: Path) -> None:
    certs = tree / "certs"
    shutil.copy(certs / "pdp-0.key", certs / "prfaas-0.key")
    _one_line(_serve(tree), str(certs / "prfaas-0.key"), "does not match certificate",
              str(certs / "prfaas-0.pem"))


def test_expired_certificate(tree: Path) -> None:
    certs = tree / "certs"
    ca = Authority()  # re-issue the CA and an expired router certificate from it
    ca.write_ca(certs)
    for name in ("prfaas-0", "pdp-0", "pdd-0"):
        ca.write_member(certs, Member(name))
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=400)
    ca.write_member(certs, Member("router"), days=30, valid_from=old)
    _one_line(_serve(tree, subprocess_run=True), str(certs / "router.pem"), "expired on")


def test_no_certs_folder_for_a_remote_prfaas_topology(tmp_path: Path) -> None:
    """PrfaaS workers on another host: TLS is on by default, with certs/ beside the file."""
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump({
        "name": "remote", "router": {"port": 0},
        "workers": [{"name": "prfaas-0", "role": "prfaas", "host": "10.9.9.9"},
                    {"name": "pdp-0", "role": "pd-p"}, {"name": "pdd-0", "role": "pd-d"}]}))
    proc = _prfaas("serve", "--topology", str(path))
    _one_line(proc, str(tmp_path / "certs" / "ca.pem"), "prfaas certs init")


def test_short_api_key_is_one_line(tmp_path: Path) -> None:
    proc = _prfaas("serve", "--api-key", "short", "--port", "0")
    _one_line(proc, "--api-key", ">= 8 printable characters")
    assert "short" not in proc.stderr  # the value of a secret is never echoed
