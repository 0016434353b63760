"""`prfaas serve` as a user runs it: comes up, answers, and SIGINT stops every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_helpers import complete, topology

pytestmark = pytest.mark.timeout(900)  # generous: a loaded CI host starts slowly


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_cli_starts_and_sigint_stops_all(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    topology().dump(path)
    logs = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "prfaas", "serve", "--topology", str(path),
                             "--port", "0", "--threshold", "100", "--log-dir", str(logs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # its own group: cleanup reaches children
                            # as a background job of a non-interactive shell (a CI script)
                            # starts it: SIGINT ignored, which Python keeps ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        url, deadline = None, time.monotonic() + 600
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "serve exited before the router came up"
            if line.startswith("router: "):
                url = line.split()[1]
        assert url is not None
        reply = complete(url, "x" * 150, max_tokens=2)
        assert reply["prfaas"]["route"] == "prfaas"  # --threshold 100 took effect
        assert reply["prfaas"]["threshold_tokens"] == 100
        children = [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
        assert len(children) == 4  # 3 workers + router
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        gone_by = time.monotonic() + 60  # readiness-driven: poll until the children are gone
        while [c for c in children if _alive(c)] and time.monotonic() < gone_by:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every component it started
            proc.wait(10)
