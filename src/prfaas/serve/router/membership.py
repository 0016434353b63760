"""Which workers the router may use: active health checks, passive marks, restarts.

Every `health.interval_s` the router GETs each worker's /health (bounded by `timeout_s`).
`failures_before_down` failed checks in a row take an up worker down; `successes_before_up`
good ones bring a down worker back. A connection the backend could not open or that the
worker dropped (`suspect`) takes it down at once: the next request does not wait a check
interval to avoid a dead worker. A new pid in /health is a restart (counted; an up worker that
restarted between two checks lost what it held, so its watchers fire as for a down).

What the policy sees follows from this: `LiveCluster.down` is kept equal to the down set, and
the `ClusterView` lists only up workers, so the same policy objects route around down ones
(policy.base falls back to the other cluster). `down_event(name)` is an asyncio.Event set when
the worker goes down: the dispatcher ends an attempt on it at once instead of waiting for a
timeout. `degraded` is true while any worker is down. A worker the deployment is restarting
in another role (`switching`, serve/router/shape.py) is not checked until it `rejoin`s with its
new pid: its restart is a role change, not a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prfaas.serve.engines import backend_class
from prfaas.serve.resilience import HealthSpec
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.tasks import cancel_and_wait
from prfaas.serve.topology import Topology, WorkerSpec

log = logging.getLogger("prfaas.serve.router.membership")


@dataclass(slots=True)
class WorkerHealth:
    up: bool = True  # the deployment waited for every worker's /health before the router
    pid: int | None = None
    node_id: str | None = None  # where a cluster manager placed it (serve/placement.py)
    failures: int = 0  # consecutive failed checks
    successes: int = 0  # consecutive good checks
    restarts: int = 0  # new pids seen
    transitions: int = 0  # up <-> down changes
    role_changes: int = 0  # restarts in another role (serve/router/shape.py)
    last_error: str = ""
    down_event: asyncio.Event = field(default_factory=asyncio.Event)


class Membership:
    def __init__(self, topology: Topology, cluster: LiveCluster,
                 session: aiohttp.ClientSession | None,
                 on_restart: Callable[[str], None] | None = None) -> None:
        self.topology, self.cluster, self.session = topology, cluster, session
        self.on_restart = on_restart  # e.g. forget the restarted worker's cache
        self.spec: HealthSpec = topology.health
        self.health_has_body = backend_class(topology.engine).health_has_body
        self.states = {w.name: WorkerHealth() for w in topology.workers}
        self.switching: set[str] = set()  # restarting in another role: not checked
        self._task: asyncio.Task[None] | None = None

    # --- what the router reads ---
    def is_up(self, name: str) -> bool:
        return self.states[name].up

    @property
    def down(self) -> frozenset[str]:
        return frozenset(n for n, s in self.states.items() if not s.up)

    @property
    def degraded(self) -> bool:
        return bool(self.down)

    def down_event(self, name: str) -> asyncio.Event:
        return self.states[name].down_event

    def to_json(self) -> dict[str, Any]:
        roles = {w.name: w.role for w in self.topology.workers}
        return {n: {"up": s.up, "pid": s.pid, "node_id": s.node_id, "restarts": s.restarts,
                    "transitions": s.transitions, "last_error": s.last_error,
                    "role": roles.get(n), "role_changes": s.role_changes,
                    "switching": n in self.switching}
                for n, s in self.states.items()}

    def rejoin(self, name: str, pid: int | None, role_changed: bool) -> None:
        """The deployment restarted `name` (in another role when `role_changed`, else back in
        its own after a failed change) and it answers /health with `pid`: up, checked again."""
        state = self.states[name]
        self.switching.discard(name)
        state.pid, state.failures, state.successes = pid, 0, 0
        state.role_changes += int(role_changed)
        self._set(name, True, "rejoined after a role change" if role_changed
                  else "rejoined in its old role")

    # --- what changes it ---
    def suspect(self, name: str, reason: str) -> None:
        """Passive: the worker could not be reached or dropped a connection."""
        state = self.states.get(name)
        if state is None:
            return
        state.successes, state.last_error = 0, reason
        state.failures = max(state.failures, self.spec.failures_before_down)
        self._set(name, False, f"passive: {reason}")

    def observe(self, name: str, pid: int | None, error: str = "") -> None:
        """One active check: `error` empty means /health answered ok with `pid`."""
        if name in self.switching:  # a check sent before its restart began: says nothing
            return
        state = self.states[name]
        if error:
            state.failures, state.successes, state.last_error = state.failures + 1, 0, error
            if state.failures >= self.spec.failures_before_down:
                self._set(name, False, error)
            return
        state.failures, state.successes = 0, state.successes + 1
        if pid is not None and state.pid is not None and pid != state.pid:
            state.restarts += 1
            log.warning("%s restarted: pid %s -> %s", name, state.pid, pid)
            if self.on_restart is not None:
                self.on_restart(name)
            if state.up:  # died and came back between two checks: its requests are gone
                state.down_event.set()
                state.down_event = asyncio.Event()
        state.pid = pid if pid is not None else state.pid
        if not state.up and state.successes >= self.spec.successes_before_up:
            self._set(name, True, "health checks pass")

    def _set(self, name: str, up: bool, why: str) -> None:
        state = self.states[name]
        if state.up == up:
            return
        state.up, state.transitions = up, state.transitions + 1
        if up:
            state.down_event = asyncio.Event()
        else:
            state.down_event.set()
        self.cluster.down = self.down
        log.warning("%s is %s (%s)", name, "up" if up else "down", why)

    # --- the active checker ---
    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.gather(*(self._check(w) for w in self.topology.workers
                                   if w.name not in self.switching))
            await asyncio.sleep(max(self.spec.interval_s - (time.monotonic() - t0), 0.01))

    async def _check(self, worker: WorkerSpec) -> None:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout_s)
        try:
            async with self.session.get(f"{worker.url}/health", timeout=timeout,
                                        server_hostname=worker.tls_name) as resp:
                if self.health_has_body:
                    body = await resp.json(content_type=None)
                else:  # e.g. vLLM's /health: 200 and an empty body
                    body = {"ok": resp.status == 200}
                if resp.status != 200 or not isinstance(body, dict) or not body.get("ok"):
                    raise ValueError(f"/health answered HTTP {resp.status}")
                pid, node_id = body.get("pid"), body.get("node_id")
                if isinstance(node_id, str):
                    self.states[worker.name].node_id = node_id
                self.observe(worker.name, pid if isinstance(pid, int) else None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.observe(worker.name, None, f"{type(exc).__name__}: {exc}" if str(exc)
                         else type(exc).__name__)
