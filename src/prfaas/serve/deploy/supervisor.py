"""Supervision of a deployment's processes: one that exits unexpectedly is started again.

A thread polls every process; when one has exited and the deployment is not stopping, it is
respawned after a backoff that starts at `restart.initial_backoff_s` and doubles per
consecutive exit up to `restart.max_backoff_s` (a process that stayed up `reset_after_s`
starts from the initial backoff again). Each exit and restart is logged (the `log` callback,
and `launcher.log` in the deployment's log folder); restart counts are kept per name. The
router also sees a restart, as a new pid in the worker's /health (`prfaas_worker_restarts_total`).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prfaas.serve.resilience import RestartSpec

POLL_S = 0.1


@dataclass(slots=True)
class _Child:
    proc: subprocess.Popen[bytes]
    started_at: float
    backoff_s: float
    restart_at: float | None = None  # set once the exit is seen


class Supervisor:
    def __init__(self, spawn: Callable[[str, bool], subprocess.Popen[bytes]],
                 spec: RestartSpec, log: Callable[[str], None]) -> None:
        self._spawn, self.spec, self._log = spawn, spec, log
        self._children: dict[str, _Child] = {}
        self.restarts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._children[name] = _Child(proc, time.monotonic(), self.spec.initial_backoff_s)
            self.restarts.setdefault(name, 0)

    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        with self._lock:
            return {name: c.proc for name, c in self._children.items()}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="prfaas-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No restart after this returns (the caller then terminates the processes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                for name, child in self._children.items():
                    self._check(name, child)

    def _check(self, name: str, child: _Child) -> None:
        now = time.monotonic()
        code = child.proc.poll()
        if code is None:
            return
        if child.restart_at is None:
            if now - child.started_at >= self.spec.reset_after_s:
                child.backoff_s = self.spec.initial_backoff_s
            child.restart_at = now + child.backoff_s
            self._log(f"{name} (pid {child.proc.pid}) exited with code {code}; "
                      f"restarting in {child.backoff_s:.1f} s")
            return
        if now < child.restart_at:
            return
        try:
            proc = self._spawn(name, True)
        except OSError as exc:
            child.restart_at = now + child.backoff_s
            self._log(f"{name}: restart failed ({exc}); next try in {child.backoff_s:.1f} s")
            return
        self.restarts[name] += 1
        self._children[name] = _Child(proc, now, min(child.backoff_s * 2, self.spec.max_backoff_s))
        self._log(f"{name} restarted as pid {proc.pid} (restart {self.restarts[name]})")
