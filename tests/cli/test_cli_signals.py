"""SIGTERM to a `prfaas` command runs its cleanup, as Ctrl-C does: a profile or sim-vs-live run
stops the engine instances it started instead of leaving them behind (seen: SIGTERM to
`prfaas sim-vs-live` in its profile step left two vLLM instances running)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# a stand-in command that holds a resource until its `finally` gives it back
HOLD = '''
import time
from pathlib import Path
import click

@click.command()
@click.argument("flag")
def command(flag):
    p = Path(flag)
    try:
        p.write_text("held")
        time.sleep(120)
    finally:
        p.write_text("released")
'''

RUN = '''
import sys
import prfaas.cli as c
c.COMMANDS["hold"] = ("holdcmd", "hold a resource")
if sys.argv[1] == "main":
    c.main(["hold", sys.argv[2]])
else:  # the click group alone, without prfaas' main: Python's default SIGTERM
    c.cli.main(args=["hold", sys.argv[2]], prog_name="prfaas", standalone_mode=False)
'''


def _term_while_held(tmp_path: Path, entry: str) -> tuple[int, str]:
    (tmp_path / "holdcmd.py").write_text(HOLD)
    flag = tmp_path / f"flag-{entry}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, "-c", RUN, entry, str(flag)], env=env)
    try:
        deadline = time.monotonic() + 120  # readiness-driven: a loaded host imports slowly
        while not (flag.exists() and flag.read_text() == "held"):
            assert proc.poll() is None, "the command exited before holding"
            assert time.monotonic() < deadline, "the command never held its resource"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, flag.read_text()


def test_sigterm_runs_the_commands_cleanup(tmp_path: Path) -> None:
    assert _term_while_held(tmp_path, "main") == (128 + signal.SIGTERM, "released")


def test_negative_control_without_the_handler_the_cleanup_is_skipped(tmp_path: Path) -> None:
    rc, state = _term_while_held(tmp_path, "bare")
    assert rc == -signal.SIGTERM and state == "held"


def test_the_handler_is_put_back_after_the_command() -> None:
    from prfaas.cli import main

    before = signal.getsignal(signal.SIGTERM)
    with contextlib.suppress(SystemExit):
        main(["--version"])
    assert signal.getsignal(signal.SIGTERM) is before
