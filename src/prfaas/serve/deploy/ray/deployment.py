"""`prfaas serve --ray ADDRESS`: a topology's router and workers on a Ray cluster, or on one
Ray cluster per datacenter (`--ray dc_prfaas=ADDR --ray dc_local=ADDR`).

`RayDeployment(topology, spec, address).start()` makes one ComponentActor (actor.py) per worker
and one for the router, each placed by the custom resource the topology's `ray:` section names
(spec.py), asks each where it landed (node IP, free ports), writes the resolved topology
(hosts = node IPs) to a TopologyStore actor per cluster, launches the workers, waits until each
answers /health on its node, then the router. With one address the Ray driver is this process;
with one address per datacenter each cluster gets its own driver process (part.py: a Ray driver
connects to one cluster), and a component goes to the cluster of its resource, the router to
the local DC's. Ray restarts a component whose process dies (`max_restarts`); the router's
membership sees the worker go down and come back with a new pid, as on one host. With a
topology `shape:` section a ShapeExecutor (shape.py) carries out the router's role changes.
`stop()` stops the router first, then the workers, and kills the actors. The surface (`url`,
`topology`, `pid`, `stop`, the context manager) is the embedded launcher's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from prfaas.security.apikey import ENV as API_KEY_ENV
from prfaas.serve.deploy.ray.part import (
    NO_USAGE_STATS,
    ClusterPart,
    RayDeploymentError,
    RemotePart,
)
from prfaas.serve.deploy.ray.shape import ShapeExecutor
from prfaas.serve.deploy.ray.spec import ROUTER, RaySpec
from prfaas.serve.engines import engine_backend
from prfaas.serve.topology import Topology, WorkerSpec

__all__ = ["NO_USAGE_STATS", "RayDeployment", "RayDeploymentError"]
T = TypeVar("T")
Part = ClusterPart | RemotePart


class RayDeployment:
    def __init__(self, topology: Topology, spec: RaySpec, address: str | dict[str, str],
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
        # cluster address -> component names on it (checked now: a bad --ray fails before Ray)
        names = [w.name for w in topology.workers] + [ROUTER]
        self.placement = ({address: names} if isinstance(address, str)
                          else spec.clusters(topology, address))
        self.parts: list[Part] = []
        self.executor: ShapeExecutor | None = None  # role changes, with `shape:`

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

    def _each(self, fn: Callable[[Part], T]) -> list[T]:
        """`fn` on every part: in this thread for one, at once for one per datacenter."""
        if len(self.parts) == 1:
            return [fn(self.parts[0])]
        with ThreadPoolExecutor(len(self.parts)) as pool:
            return list(pool.map(fn, self.parts))

    def start(self) -> None:
        for key, value in NO_USAGE_STATS.items():
            os.environ.setdefault(key, value)
        kind = ClusterPart if isinstance(self.address, str) else RemotePart
        backend = engine_backend(self.requested)
        backend.prepare()  # e.g. vLLM: build the tiny model (at the same path on every node)
        self.start_timeout_s = max(self.start_timeout_s, backend.start_timeout_s)
        try:
            for address, names in self.placement.items():
                env = ({ROUTER: {API_KEY_ENV: self.api_key}}
                       if ROUTER in names and self.api_key is not None else {})
                self.parts.append(kind(
                    address, {n: self.spec.resource_of(self.requested, n) for n in names},
                    self.spec.amount, self.spec.max_restarts, env, self.log_dir,
                    self.start_timeout_s))
            where: dict[str, dict[str, Any]] = {}
            for placed in self._each(lambda p: p.place()):
                where.update(placed)
            self.topology = self._resolve(where)
            text = self._text()
            self._each(lambda p: p.put(text))
            urls = {w.name: w.url for w in self.topology.workers}
            self._each(lambda p: p.launch(text, {n: urls[n] for n in p.names if n in urls}))
            self._each(lambda p: p.launch(text, {ROUTER: self.url} if ROUTER in p.names
                                          else {}))
            if self.topology.shape is not None:
                self.executor = ShapeExecutor(self)
                self.executor.start()
        except BaseException:
            self.stop()
            raise

    def _resolve(self, where: dict[str, dict[str, Any]]) -> Topology:
        """The requested topology at the nodes' addresses; port 0 -> a port free there."""
        vllm = self.requested.vllm
        events = vllm is not None and vllm.kv_events

        def place(w: WorkerSpec) -> WorkerSpec:
            at = where[w.name]
            kv_port = (w.kv_port or at["ports"][1]) if w.role == "pd-d" else 0
            events_port = (w.events_port or at["ports"][2]) if events and w.engine == "vllm" \
                else w.events_port  # where a vLLM instance publishes its KV events
            return replace(w, host=at["ip"], port=w.port or at["ports"][0], kv_port=kv_port,
                           events_port=events_port)

        router = where[ROUTER]
        return replace(self.requested, workers=tuple(place(w) for w in self.requested.workers),
                       router_host=router["ip"],
                       router_port=self.requested.router_port or router["ports"][0])

    def _text(self) -> str:
        return self.text_of(self.topology)

    @staticmethod
    def text_of(topology: Topology) -> str:
        import yaml

        return yaml.safe_dump(topology.to_dict(), sort_keys=False)

    def part_of(self, name: str) -> Part:
        """The cluster part that runs component `name`."""
        return next(p for p in self.parts if name in p.names)

    def info(self) -> dict[str, dict[str, Any]]:
        """Each component's pid, Ray node id and address, as its actor reports them now."""
        out: dict[str, dict[str, Any]] = {}
        for part in self._each(lambda p: p.info()):
            out.update(part)
        return out

    def pid(self, name: str) -> int:
        pid: int = self.info()[name]["pid"]
        return pid

    def stop(self) -> None:
        if self.executor is not None:
            self.executor.stop()
            self.executor = None
        # the router's cluster first: no new work reaches the workers
        for part in sorted(self.parts, key=lambda p: ROUTER not in p.names):
            part.stop(self._log)
        self.parts.clear()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
