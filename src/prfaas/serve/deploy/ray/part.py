"""The components of one deployment that run on one Ray cluster.

`ClusterPart` drives them in this process (one `ray.init`); `RemotePart` runs a ClusterPart in a
child process (`python -m prfaas.serve.deploy.ray.part`), because a Ray driver connects to one
cluster per process and `--ray dc_prfaas=A --ray dc_local=B` needs one per datacenter. The
child speaks JSON lines: a request on its stdin, one `@@prfaas {...}` reply line on its stdout
(everything else it prints, Ray's noise included, goes to its log). It stops its components and
exits when its stdin closes, so a dead `prfaas serve` leaves nothing running on either cluster.

ADDRESS is what `ray.init` takes: the GCS `HOST:PORT` when this host is a node of that cluster,
or `ray://HEAD:PORT` (Ray Client) when it is not, e.g. the other datacenter's cluster.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from prfaas.core.errors import PrfaasError

NO_USAGE_STATS = {"RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1"}
MARK = "@@prfaas "
OPS = ("place", "put", "launch", "relaunch", "ports", "info", "stop")


class RayDeploymentError(PrfaasError):
    """A component did not come up on the Ray cluster; names it and shows its log tail."""


class ClusterPart:
    """`resources`: component name -> the custom resource that places it, in this cluster."""

    def __init__(self, address: str, resources: dict[str, str], amount: float,
                 max_restarts: int, env: dict[str, dict[str, str]], log_dir: str,
                 timeout_s: float) -> None:
        self.address, self.resources, self.amount = address, resources, amount
        self.max_restarts, self.env, self.log_dir = max_restarts, env, log_dir
        self.timeout_s = timeout_s
        self.actors: dict[str, Any] = {}
        self._store: Any = None
        self._connected = False

    @property
    def names(self) -> list[str]:
        return list(self.resources)

    def place(self) -> dict[str, dict[str, Any]]:
        """Connect, make one actor per component, and say where each landed."""
        import ray

        from prfaas.serve.deploy.ray.actor import ComponentActor, TopologyStore

        for key, value in NO_USAGE_STATS.items():
            os.environ.setdefault(key, value)
        if not ray.is_initialized():
            self._connect()
        first = next(iter(self.resources.values()))
        self._store = TopologyStore.options(  # type: ignore[attr-defined]
            resources={first: self.amount}).remote()
        cls = ray.remote(ComponentActor)
        for name, resource in self.resources.items():
            self.actors[name] = cls.options(
                name=None, num_cpus=0, resources={resource: self.amount},
                max_restarts=self.max_restarts, max_task_retries=-1,
            ).remote(name, self._store, self.log_dir, {**NO_USAGE_STATS, **self.env.get(name, {})})
        return {n: ray.get(a.where.remote(3), timeout=self.timeout_s)  # HTTP, KV, KV events
                for n, a in self.actors.items()}

    def _connect(self, attempts: int = 3) -> None:
        """ray.init; a Ray Client connection is tried again: its proxy can lose the race with
        the per-client server it starts (proxier.py reads the cmdline of a process that has
        just exited: `psutil.ZombieProcess`), seen once here on a loaded host."""
        import ray

        for attempt in range(attempts):
            try:
                ray.init(address=self.address, logging_level=logging.WARNING,
                         log_to_driver=False)
                self._connected = True
                return
            except ConnectionError:
                if not self.address.startswith("ray://") or attempt == attempts - 1:
                    raise
                ray.shutdown()
                time.sleep(2.0)

    def put(self, text: str) -> None:
        import ray

        ray.get(self._store.put.remote(text), timeout=self.timeout_s)

    def launch(self, text: str, urls: dict[str, str]) -> None:
        """Start the components named in `urls` and wait until each answers /health."""
        import ray

        ray.get([self.actors[n].launch.remote(text) for n in urls], timeout=self.timeout_s)
        pending = {n: self.actors[n].wait_healthy.remote(u, self.timeout_s)
                   for n, u in urls.items()}
        for name, ref in pending.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise RayDeploymentError(f"{name} did not start: {exc.cause}") from None

    def ports(self, name: str, count: int) -> list[int]:
        """`count` ports free now on the node of component `name`."""
        import ray

        where: dict[str, Any] = ray.get(self.actors[name].where.remote(count),
                                        timeout=self.timeout_s)
        ports: list[int] = where["ports"]
        return ports

    def relaunch(self, name: str, text: str, url: str) -> int:
        """Restart component `name` from the resolved topology `text` (its new role) and wait
        until it answers /health at `url`; its new pid."""
        import ray

        actor = self.actors[name]
        ray.get(actor.relaunch.remote(text), timeout=self.timeout_s)
        try:
            pid: int = ray.get(actor.wait_healthy.remote(url, self.timeout_s))
        except ray.exceptions.RayTaskError as exc:
            raise RayDeploymentError(f"{name} did not start: {exc.cause}") from None
        return pid

    def info(self) -> dict[str, dict[str, Any]]:
        import ray

        return {n: ray.get(a.info.remote(), timeout=self.timeout_s)
                for n, a in self.actors.items()}

    def stop(self, log: Any = None) -> None:
        import ray

        from prfaas.serve.deploy.ray.spec import ROUTER

        order = sorted(self.actors, key=lambda n: n != ROUTER)  # no new work reaches workers
        for name in order:
            try:
                ray.get(self.actors[name].stop.remote(), timeout=30)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # dead: nothing to stop
                if log is not None:
                    log(f"{name}: stop: {type(exc).__name__}")
            ray.kill(self.actors[name], no_restart=True)
        self.actors.clear()
        if self._store is not None:
            ray.kill(self._store)
            self._store = None
        if self._connected:
            ray.shutdown()
            self._connected = False


class RemotePart:
    """A ClusterPart in a child process (its own Ray driver); the same methods."""

    def __init__(self, address: str, resources: dict[str, str], amount: float,
                 max_restarts: int, env: dict[str, dict[str, str]], log_dir: str,
                 timeout_s: float) -> None:
        self.address, self.resources, self.timeout_s = address, resources, timeout_s
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"driver-{'-'.join(resources)}.log")
        self._lock = threading.Lock()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "prfaas.serve.deploy.ray.part"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env={**os.environ, **NO_USAGE_STATS, "PYTHONUNBUFFERED": "1"}, text=True)
        self._call("init", address=address, resources=resources, amount=amount,
                   max_restarts=max_restarts, env=env, log_dir=log_dir, timeout_s=timeout_s)

    @property
    def names(self) -> list[str]:
        return list(self.resources)

    def _call(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            try:
                self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise RayDeploymentError(f"driver for {self.address} is gone:\n"
                                         f"{self._tail()}") from None
            for line in self.proc.stdout:
                if line.startswith(MARK):
                    reply = json.loads(line[len(MARK):])
                    if "error" in reply:
                        raise RayDeploymentError(f"{self.address}: {reply['error']}")
                    return reply["result"]
        raise RayDeploymentError(f"driver for {self.address} exited "
                                 f"(code {self.proc.wait()}):\n{self._tail()}")

    def _tail(self, num_bytes: int = 3000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read()[-num_bytes:].decode(errors="replace")

    def place(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self._call("place")
        return result

    def put(self, text: str) -> None:
        self._call("put", text=text)

    def launch(self, text: str, urls: dict[str, str]) -> None:
        self._call("launch", text=text, urls=urls)

    def ports(self, name: str, count: int) -> list[int]:
        result: list[int] = self._call("ports", name=name, count=count)
        return result

    def relaunch(self, name: str, text: str, url: str) -> int:
        result: int = self._call("relaunch", name=name, text=text, url=url)
        return result

    def info(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self._call("info")
        return result

    def stop(self, log: Any = None) -> None:
        if self.proc.poll() is None:
            try:
                self._call("stop")
            except RayDeploymentError as exc:
                if log is not None:
                    log(str(exc))
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _serve(stdin: IO[str], stdout: IO[str]) -> None:
    part: ClusterPart | None = None
    try:
        for line in stdin:
            request = json.loads(line)
            op = request.pop("op")
            try:
                if op == "init":
                    part = ClusterPart(**request)
                    result: Any = None
                elif op not in OPS or part is None:
                    raise ValueError(f"unknown request {op!r} (or before init)")
                else:
                    method: Callable[..., Any] = getattr(part, op)
                    result = method(**request)
                reply: dict[str, Any] = {"result": result}
            except Exception as exc:  # the parent raises it, with its text
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            stdout.write(MARK + json.dumps(reply) + "\n")
            stdout.flush()
            if op == "stop":
                part = None
    finally:
        if part is not None:  # the parent went away without `stop`
            part.stop()


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the parent orders the stop (router first)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(sys.stdin, sys.stdout)
