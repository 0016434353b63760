"""`prfaas serve --ray ADDRESS`: a topology's router and workers on a Ray cluster.

`RayDeployment(topology, spec, address).start()` connects to the cluster, makes one
ComponentActor (actor.py) per worker and one for the router, each placed by the custom resource
the topology's `ray:` section names (spec.py), asks each where it landed (node IP, free ports),
writes the resolved topology (hosts = node IPs) to a TopologyStore actor, launches the workers,
waits until each answers /health on its node, then the router. Ray restarts a component whose
process dies (`max_restarts`); the router's membership sees the worker go down and come back
with a new pid, as on one host. `stop()` stops the router first, then the workers, and kills
the actors. The surface (`url`, `topology`, `pid`, `stop`, the context manager) is the
embedded launcher's.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray

from prfaas.core.errors import PrfaasError
from prfaas.security.apikey import ENV as API_KEY_ENV
from prfaas.serve.deploy.ray.actor import ComponentActor, TopologyStore
from prfaas.serve.deploy.ray.spec import ROUTER, RaySpec
from prfaas.serve.topology import Topology, WorkerSpec

NO_USAGE_STATS = {"RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1"}


class RayDeploymentError(PrfaasError):
    """A component did not come up on the Ray cluster; names it and shows its log tail."""


class RayDeployment:
    def __init__(self, topology: Topology, spec: RaySpec, address: str,
                 start_timeout_s: float = 300.0, log_dir: str | None = None,
                 log: Callable[[str], None] | None = None, api_key: str | None = None) -> None:
        spec.check(topology)
        self.requested, self.spec, self.address = topology, spec, address
        self.topology = topology  # resolved by start(): hosts are the nodes' addresses
        self.start_timeout_s = start_timeout_s
        self.api_key = api_key
        self._own_log_dir = log_dir is None  # each node's logs go to this path on that node
        self.log_dir = log_dir or os.path.join(tempfile.gettempdir(),
                                               f"prfaas-ray-{uuid.uuid4().hex[:8]}")
        self._echo = log
        self.actors: dict[str, Any] = {}
        self._store: Any = None
        self._connected = False

    @property
    def url(self) -> str:
        return self.topology.router_url

    def __enter__(self) -> RayDeployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log(self, message: str) -> None:
        if self._echo is not None:
            self._echo(message)

    def start(self) -> None:
        for key, value in NO_USAGE_STATS.items():
            os.environ.setdefault(key, value)
        try:
            if not ray.is_initialized():
                ray.init(address=self.address, logging_level=logging.WARNING,
                         log_to_driver=False)
                self._connected = True
            self._store = TopologyStore.options(  # type: ignore[attr-defined]
                resources={self.spec.resources[ROUTER]: self.spec.amount}).remote()
            names = [w.name for w in self.requested.workers] + [ROUTER]
            for name in names:
                self.actors[name] = self._actor(name)
            self.topology = self._resolve({n: ray.get(self.actors[n].where.remote(2),
                                                      timeout=self.start_timeout_s)
                                           for n in names})
            ray.get(self._store.put.remote(self._text()))
            workers = [w.name for w in self.topology.workers]
            self._launch(workers)
            self._launch([ROUTER])
        except BaseException:
            self.stop()
            raise

    def _actor(self, name: str) -> Any:
        env = dict(NO_USAGE_STATS)
        if name == ROUTER and self.api_key is not None:
            env[API_KEY_ENV] = self.api_key
        resource = self.spec.resource_of(self.requested, name)
        cls = ray.remote(ComponentActor)
        return cls.options(
            name=None, num_cpus=0, resources={resource: self.spec.amount},
            max_restarts=self.spec.max_restarts, max_task_retries=-1,
        ).remote(name, self._store, self.log_dir, env)

    def _resolve(self, where: dict[str, dict[str, Any]]) -> Topology:
        """The requested topology at the nodes' addresses; port 0 -> a port free there."""
        def place(w: WorkerSpec) -> WorkerSpec:
            at = where[w.name]
            kv_port = (w.kv_port or at["ports"][1]) if w.role == "pd-d" else 0
            return replace(w, host=at["ip"], port=w.port or at["ports"][0], kv_port=kv_port)

        router = where[ROUTER]
        return replace(self.requested, workers=tuple(place(w) for w in self.requested.workers),
                       router_host=router["ip"],
                       router_port=self.requested.router_port or router["ports"][0])

    def _text(self) -> str:
        import yaml

        return yaml.safe_dump(self.topology.to_dict(), sort_keys=False)

    def _launch(self, names: list[str]) -> None:
        ray.get([self.actors[n].launch.remote(self._text()) for n in names])
        urls = {w.name: w.url for w in self.topology.workers} | {ROUTER: self.url}
        pending = {n: self.actors[n].wait_healthy.remote(urls[n], self.start_timeout_s)
                   for n in names}
        for name, ref in pending.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise RayDeploymentError(f"{name} did not start: {exc.cause}") from None

    def info(self) -> dict[str, dict[str, Any]]:
        """Each component's pid, Ray node id and address, as its actor reports them now."""
        return {n: ray.get(a.info.remote(), timeout=self.start_timeout_s)
                for n, a in self.actors.items()}

    def pid(self, name: str) -> int:
        pid: int = self.info()[name]["pid"]
        return pid

    def stop(self) -> None:
        order = sorted(self.actors, key=lambda n: n != ROUTER)  # no new work reaches workers
        for name in order:
            try:
                ray.get(self.actors[name].stop.remote(), timeout=30)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # dead: nothing to stop
                self._log(f"{name}: stop: {type(exc).__name__}")
            ray.kill(self.actors[name], no_restart=True)
        self.actors.clear()
        if self._store is not None:
            ray.kill(self._store)
            self._store = None
        if self._connected:
            ray.shutdown()
            self._connected = False
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
