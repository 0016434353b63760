"""A Ray deployment carrying out the router's role changes (serve/router/shape.py).

`ShapeExecutor(deployment)` polls the router's `GET /shape` every `poll_s`. When a change is
`drained` (the router routes nothing new to the instance and nothing of it is in flight):
1. it tells the router it restarts the instance (`POST /shape/switch`: health checks pause);
2. it asks the instance's actor for ports free on its node, resolves the topology with the
   instance in its new role there (a `pd-d` gets a KV port) and has the actor stop the process
   and start it in that role, waiting until it answers /health (warm: a worker answers only
   once its engine is loaded);
3. it stores that topology for the cluster (should Ray restart the actor later, it comes back in
   its new role) and tells the router where the instance is now (`POST /shape/join`, ok).
If the new role does not come up, the actor starts the old role again on fresh ports, and the
router is told `ok: false` with what failed: the old role is restored, nothing else changed.
`ports` (name -> ports) can be replaced, e.g. by a test that holds a port to make a start
fail. `log` lists each change carried out (instance, roles, seconds to restart, pids).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prfaas.core.errors import PrfaasError

if TYPE_CHECKING:
    from prfaas.serve.deploy.ray.deployment import RayDeployment
    from prfaas.serve.topology import WorkerSpec

log = logging.getLogger("prfaas.serve.deploy.ray.shape")


class ShapeExecutor:
    def __init__(self, deployment: RayDeployment, poll_s: float = 0.5) -> None:
        self.dep, self.poll_s = deployment, poll_s
        self.log: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.ports = self._free_ports
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shape-executor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                change = self._call("GET", "/shape").get("change")
                if change is not None and change["state"] == "drained":
                    self.carry_out(change)
            except Exception as exc:  # the router restarting, ...: try again next poll
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("shape executor: %s", exc)

    def carry_out(self, change: dict[str, Any]) -> dict[str, Any]:
        name, role = str(change["instance"]), str(change["to"])
        old = self.dep.topology.worker(name)
        self._call("POST", "/shape/switch", {"instance": name})
        t0 = time.monotonic()
        try:
            new, pid = self._restart(old, role)
            ok, detail = True, ""
        except Exception as exc:  # the new role did not come up: the old one again
            detail = f"{role} did not start: {type(exc).__name__}: {exc}"
            log.warning("shape executor: %s; restoring %s", detail, old.role)
            ok = False
            try:
                new, pid = self._restart(old, old.role)
            except Exception as again:  # its health checks will hold it down
                detail += f"; restoring {old.role} failed too: {type(again).__name__}: {again}"
                new, pid = old, -1
        if pid < 0:
            self.errors.append(detail)
        entry = {"instance": name, "from": old.role, "to": new.role, "ok": ok,
                 "detail": detail, "restart_s": round(time.monotonic() - t0, 3),
                 "pid": pid, "port": new.port, "kv_port": new.kv_port}
        self._call("POST", "/shape/join", {"instance": name, "ok": ok, "detail": detail,
                                           "host": new.host, "port": new.port,
                                           "kv_port": new.kv_port, "pid": pid})
        self.log.append(entry)
        return entry

    def _restart(self, old: WorkerSpec, role: str) -> tuple[WorkerSpec, int]:
        """`old`'s instance restarted as `role` on fresh ports of its node; the topology
        stored for its cluster only once it answers."""
        port, kv_port = self.ports(old.name)
        spec = replace(old, role=role, port=port,  # type: ignore[arg-type]
                       kv_port=kv_port if role == "pd-d" else 0)
        topology = replace(self.dep.topology, workers=tuple(
            spec if w.name == old.name else w for w in self.dep.topology.workers))
        text = self.dep.text_of(topology)
        part = self.dep.part_of(old.name)
        pid = part.relaunch(old.name, text, spec.url)
        self.dep.topology = topology
        part.put(text)
        return spec, pid

    def _free_ports(self, name: str) -> tuple[int, int]:
        ports = self.dep.part_of(name).ports(name, 2)
        return ports[0], ports[1]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None
              ) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.dep.api_key is not None:
            headers["Authorization"] = f"Bearer {self.dep.api_key}"
        req = urllib.request.Request(f"{self.dep.url}{path}", method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                out: dict[str, Any] = json.load(resp)
                return out
        except urllib.error.HTTPError as exc:
            raise PrfaasError(f"router {method} {path}: HTTP {exc.code} "
                              f"{exc.read()[:300].decode(errors='replace')}") from None
