"""One prfaas component (a worker or the router) as a process owned by a Ray actor.

The actor runs today's `python -m prfaas.serve.deploy.proc` unchanged, so the workers' HTTP and
KV transport are prfaas's own and nothing of them passes through Ray. Its contract:
- `__init__` reads the resolved topology from the deployment's TopologyStore; on the first start
  it is not there yet (the driver resolves hosts and ports from `where()` first, then calls
  `launch`), on a restart it is, so the process starts again at once at the same address.
- the child exits -> the actor exits with it (os._exit), so Ray restarts the actor
  (max_restarts) and with it the process: Ray, not prfaas's supervisor, does the restarting.
- the actor dies (its node, a kill) -> the child gets SIGKILL (PR_SET_PDEATHSIG), so no
  process outlives its actor and a restart finds its port free;
- `relaunch(text)` (a role change, serve/deploy/ray/shape.py) stops the child and starts it
  again from a new resolved topology, in the same actor: that stop is not a death.
The child's environment carries PRFAAS_NODE_ID, which its /health reports (serve/placement.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import ray

from prfaas.security.tls import Identity
from prfaas.serve.placement import NODE_ID_ENV
from prfaas.serve.ports import free_ports

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _probe_context(topology_text: str) -> ssl.SSLContext | None:
    """Under `security.tls`, the router's identity (from the certificate folder on this node)
    for probing a PrfaaS worker's HTTPS /health, as the embedded launcher does; the hostname
    check is skipped (a worker's address is its node's), the chain is verified."""
    import yaml

    tls = (yaml.safe_load(topology_text).get("security") or {}).get("tls")
    if not isinstance(tls, dict):
        return None
    ctx = Identity.load(tls["dir"], "router").client_context()
    ctx.check_hostname = False
    return ctx


@ray.remote(num_cpus=0)
class TopologyStore:
    """The resolved topology (YAML text) every component actor reads when it (re)starts."""

    def __init__(self) -> None:
        self.text: str | None = None

    def put(self, text: str) -> None:
        self.text = text

    def get(self) -> str | None:
        return self.text


class ComponentActor:
    """Owns the process of component `name`; see the module docstring."""

    def __init__(self, name: str, store: Any, log_dir: str, env: dict[str, str]) -> None:
        self.name, self.log_dir, self.env = name, Path(log_dir), env
        ctx = ray.get_runtime_context()
        self.node_id: str = ctx.get_node_id()
        self.ip: str = ray.util.get_node_ip_address()
        self.proc: subprocess.Popen[bytes] | None = None
        self.probe_tls: ssl.SSLContext | None = None  # the router's identity, under TLS
        self.stopping = False
        self._retired: set[int] = set()  # pids stopped on purpose (a relaunch)
        self._trial: int | None = None  # a relaunched pid not yet healthy: may fail to start
        self.restarted = ctx.was_current_actor_reconstructed
        text = ray.get(store.get.remote())
        if text is not None:  # a restart: the deployment is already resolved
            self.launch(text)

    def where(self, num_ports: int) -> dict[str, Any]:
        """The node this actor landed on, and ports free there for the component to use."""
        return {"node_id": self.node_id, "ip": self.ip, "ports": free_ports(num_ports, self.ip)}

    def launch(self, topology_text: str, trial: bool = False) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"topology.{self.name}.yaml"  # this node's copy
        path.write_text(topology_text)
        self.probe_tls = _probe_context(topology_text)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", NODE_ID_ENV: self.node_id}
        with open(self.log_dir / f"{self.name}.log", "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start on node {self.node_id} "
                      f"(actor restarted: {self.restarted})\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "prfaas.serve.deploy.proc", "--topology", str(path),
                 "--name", self.name], stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=_die_with_parent)
        if trial:  # before its watcher runs: an instant exit must not end the actor
            self._trial = self.proc.pid
        threading.Thread(target=self._watch, args=(self.proc,), daemon=True).start()
        return self.proc.pid

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if proc.pid == self._trial:  # a relaunch that did not start: the caller restores
            return
        if not self.stopping and proc.pid not in self._retired:  # it died: so does the
            # actor, and Ray restarts both
            with open(self.log_dir / f"{self.name}.log", "ab") as log:
                log.write(f"--- exited with code {code}; the actor exits for Ray to "
                          "restart it\n".encode())
            os._exit(1)

    def wait_healthy(self, url: str, timeout_s: float) -> int:
        """Poll the component's /health from its own node until it answers; its pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1.0,
                                            context=self.probe_tls) as resp:
                    if resp.status == 200:
                        if self._trial == self.proc.pid:
                            self._trial = None  # it started: a death from now is a death
                        return self.proc.pid
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def info(self) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None else None
        return {"name": self.name, "pid": pid, "node_id": self.node_id, "ip": self.ip}

    def log_tail(self, num_bytes: int = 3000) -> str:
        path = self.log_dir / f"{self.name}.log"
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""

    def relaunch(self, topology_text: str, timeout_s: float = 10.0) -> int:
        """Stop the component (gracefully: SIGTERM) and start it from `topology_text`."""
        if self.proc is not None:
            self._retired.add(self.proc.pid)
            self._end(self.proc, timeout_s)
        with open(self.log_dir / f"{self.name}.log", "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} relaunched (a role change)\n".encode())
        return self.launch(topology_text, trial=True)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopping = True
        if self.proc is not None:
            self._end(self.proc, timeout_s)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
