"""The `ray:` section of a topology: which Ray custom resource places each worker group.

```yaml
ray:
  resources: {prfaas: dc_prfaas, pd-p: dc_local, pd-d: dc_local, router: router}  # the defaults
  workers: {pdd-1: dc_local_b}   # optional per-worker override
  amount: 0.01                   # of the resource each component takes (100 per node of 1.0)
  max_restarts: -1               # Ray restarts a dead component this often (-1: always)
```

The section is read here and removed before the rest of the file is parsed as a Topology, so
the topology's own schema is unchanged and a file without it gets the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from prfaas.core.errors import ConfigError
from prfaas.core.files import read_text
from prfaas.serve.topology import ROLES, Topology, load_topology, parse_topology

ROUTER = "router"
DEFAULT_RESOURCES = {"prfaas": "dc_prfaas", "pd-p": "dc_local", "pd-d": "dc_local",
                     ROUTER: "router"}


@dataclass(frozen=True, slots=True)
class RaySpec:
    resources: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    workers: dict[str, str] = field(default_factory=dict)  # worker name -> resource
    amount: float = 0.01
    max_restarts: int = -1

    def __post_init__(self) -> None:
        unknown = sorted(set(self.resources) - {*ROLES, ROUTER})
        if unknown:
            raise ConfigError("ray.resources", unknown[0],
                              f"unknown role; known: {', '.join((*ROLES, ROUTER))}")
        if not 0 < self.amount <= 1:
            raise ConfigError("ray.amount", self.amount, "must be in (0, 1]")
        if self.max_restarts < -1:
            raise ConfigError("ray.max_restarts", self.max_restarts, "must be >= -1")

    def resource_of(self, topology: Topology, name: str) -> str:
        """The custom resource that places component `name` (a worker or `router`)."""
        if name == ROUTER:
            return self.resources[ROUTER]
        return self.workers.get(name, self.resources[topology.worker(name).role])

    def check(self, topology: Topology) -> None:
        known = {w.name for w in topology.workers}
        for name in self.workers:
            if name not in known:
                raise ConfigError("ray.workers", name, f"not in topology; known: {sorted(known)}")
        if topology.link.emulation == "netns":
            raise ConfigError("link.emulation", "netns",
                              "not with --ray (the namespace is made by the embedded launcher)")

    def clusters(self, topology: Topology, addresses: dict[str, str]) -> dict[str, list[str]]:
        """Component names by the address of the Ray cluster they run on (`--ray R=ADDR`, one
        per datacenter). A component goes to the cluster keyed by its resource; the router,
        unless its resource is keyed, to the cluster of the `pd-d` workers (the local DC)."""
        out: dict[str, list[str]] = {}
        for w in topology.workers:
            resource = self.resource_of(topology, w.name)
            if resource not in addresses:
                raise ConfigError("--ray", resource, f"no cluster for {w.name}'s resource; "
                                  f"given: {', '.join(sorted(addresses))}")
            out.setdefault(addresses[resource], []).append(w.name)
        router = self.resources[ROUTER]
        if router not in addresses:
            router = self.resources["pd-d"]
            if router not in addresses:
                raise ConfigError("--ray", self.resources[ROUTER],
                                  "no cluster for the router: key its resource or the pd-d "
                                  "workers' one")
        out.setdefault(addresses[router], []).append(ROUTER)
        return out


def parse_ray_addresses(values: tuple[str, ...] | list[str]) -> str | dict[str, str]:
    """`--ray` values: one ADDRESS (one cluster), or RESOURCE=ADDRESS per datacenter."""
    if not values:
        raise ConfigError("--ray", "", "needs an address")
    if len(values) == 1 and "=" not in values[0]:
        return values[0]
    out: dict[str, str] = {}
    for value in values:
        key, sep, address = value.partition("=")
        if not sep or not key or not address:
            raise ConfigError("--ray", value, "with several clusters each must be "
                              "RESOURCE=ADDRESS (e.g. dc_prfaas=ray://HEAD:10001)")
        if key in out:
            raise ConfigError("--ray", key, "given twice")
        out[key] = address
    return out


def parse_ray(raw: object) -> RaySpec:
    if raw is None:
        return RaySpec()
    if not isinstance(raw, dict):
        raise ConfigError("ray", raw, "must be a mapping")
    allowed = {"resources", "workers", "amount", "max_restarts"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError("ray", unknown[0], f"unknown key; allowed: {', '.join(sorted(allowed))}")
    resources = raw.get("resources") or {}
    workers = raw.get("workers") or {}
    if not isinstance(resources, dict) or not isinstance(workers, dict):
        raise ConfigError("ray", raw, "resources and workers must be mappings")
    return RaySpec({**DEFAULT_RESOURCES, **{str(k): str(v) for k, v in resources.items()}},
                   {str(k): str(v) for k, v in workers.items()},
                   float(raw.get("amount", 0.01)), int(raw.get("max_restarts", -1)))


def load_ray_topology(path: str | Path | None) -> tuple[Topology, RaySpec]:
    """The topology file without its `ray:` section, and that section (defaults if absent),
    checked for `--ray`."""
    topology, spec = read_ray_topology(path)
    spec.check(topology)
    return topology, spec


def read_ray_topology(path: str | Path | None) -> tuple[Topology, RaySpec]:
    """As load_ray_topology, unchecked (`prfaas certs init` reads any topology file)."""
    if path is None:
        topology, spec = load_topology(None), RaySpec()
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("topology", str(path), "no such file")
        try:
            raw: Any = yaml.safe_load(read_text(p, "topology"))
        except yaml.YAMLError as exc:
            raise ConfigError("topology", str(p), f"invalid YAML: {exc}") from exc
        section = raw.pop("ray", None) if isinstance(raw, dict) else None
        topology, spec = parse_topology(raw, str(p), p.parent), parse_ray(section)
    return topology, spec
