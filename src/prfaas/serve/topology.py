"""A serving topology: the router, every worker (an address: host:port), the links, the model.

Loaded from YAML (the embedded default is `topologies/local.yaml`), validated at construction
(unknown keys and bad values raise ConfigError naming the field), never mutated; `with_ports`
returns a copy where every port 0 is replaced by a free port of this host (tests, `--port`).
Roles: `prfaas` (prefill in the PrfaaS cluster; its KV crosses the shaped inter-DC `link`),
`pd-p` (local prefill; KV over the unshaped or faster `intra_link`), `pd-d` (local decode, with
a KV receiver on `kv_port`). Where each worker computes (`device`, `gpus`; `model.device`,
`vllm.device`): serve/gpus.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from prfaas.core.errors import ConfigError
from prfaas.core.files import read_text
from prfaas.models.compression import MODES as COMPRESSION_MODES
from prfaas.models.engine_config import check_device
from prfaas.models.kv import wire_dtype_name
from prfaas.policy.shape import ShapeConfig
from prfaas.security.spec import SecuritySpec, parse_security
from prfaas.serve.cores import parse_cores
from prfaas.serve.engines import DEFAULT_ENGINE, backend_class, engine_names
from prfaas.serve.gpus import check_worker_gpus, parse_gpus
from prfaas.serve.planned import PlanSpec, parse_plan
from prfaas.serve.ports import free_port
from prfaas.serve.resilience import (
    AdmissionSpec,
    DeadlineSpec,
    HealthSpec,
    RestartSpec,
    parse_spec,
    to_dict,
)
from prfaas.serve.vllm_settings import VllmSettings, parse_vllm

WorkerRole = Literal["prfaas", "pd-p", "pd-d"]
ROLES: tuple[str, ...] = ("prfaas", "pd-p", "pd-d")
DEFAULT_TOPOLOGY = "local.yaml"


def _keys(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(where, unknown[0], f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _mapping(raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "must be a mapping")
    return raw


EMULATIONS = ("token-bucket", "netns")


@dataclass(frozen=True, slots=True)
class LinkSpec:
    rate_gbps: float | None = None  # None: unshaped loopback
    connections: int = 4
    # token-bucket: each sender shapes itself in user space (any host, no privileges);
    # netns: the kernel shapes a veth into the PrfaaS workers' namespace (root; deploy/netns.py)
    emulation: str = "token-bucket"
    delay_stage: bool = False  # netns: KV relayed through serve/deploy/delay.py (added RTT faults)
    # full-attention KV on this link: None (its cache dtype), bf16 or fp8_e4m3 (transport/quant.py)
    wire_dtype: str | None = None
    # lossless codec on this link's DATA frames: none | lz4 | zstd | auto (transport/codec.py;
    # auto: the sender times both on its first KV and compresses when that beats its share)
    compression: str = "none"

    def __post_init__(self) -> None:
        if self.rate_gbps is not None and not self.rate_gbps > 0:
            raise ConfigError("link.rate_gbps", self.rate_gbps, "must be > 0 or null")
        if self.connections < 1:
            raise ConfigError("link.connections", self.connections, "must be >= 1")
        if self.emulation not in EMULATIONS:
            raise ConfigError("link.emulation", self.emulation,
                              f"unknown; known: {', '.join(EMULATIONS)}")
        if self.emulation == "netns" and self.rate_gbps is None:
            raise ConfigError("link.rate_gbps", None, "emulation netns needs a rate to shape to")
        if self.delay_stage and self.emulation != "netns":
            raise ConfigError("link.delay_stage", True, "needs emulation netns")
        if self.compression not in COMPRESSION_MODES:
            raise ConfigError("link.compression", self.compression,
                              f"must be one of {', '.join(COMPRESSION_MODES)}")
        if wire_dtype_name(self.wire_dtype) != self.wire_dtype:
            raise ConfigError("link.wire_dtype", self.wire_dtype,
                              f"not canonical; use {wire_dtype_name(self.wire_dtype)}")

    @property
    def sender_rate_gbps(self) -> float | None:
        """The rate a sender's own token bucket enforces (None when the kernel shapes)."""
        return self.rate_gbps if self.emulation == "token-bucket" else None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str
    role: WorkerRole
    host: str = "127.0.0.1"
    port: int = 0
    kv_port: int = 0  # pd-d only: where its KVReceiver listens
    max_batch: int = 16  # pd-d only: continuous-batching slots
    tls: bool = False  # its control API is HTTPS (prfaas workers when the topology has TLS)
    engine: str = DEFAULT_ENGINE  # a registered engine backend (serve/engines.py)
    cores: str | None = None  # vllm: VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "0-1"
    vllm_args: tuple[str, ...] = ()  # vllm: more server arguments for this instance
    events_port: int = 0  # vllm with kv_events: where the instance publishes its KV events
    device: str | None = None  # native: cpu | cuda | cuda:N (None: the model's device)
    gpus: tuple[int, ...] = ()  # on cuda: the launcher's GPU indices it gets (serve/gpus.py)

    def __post_init__(self) -> None:
        if self.engine not in engine_names():
            raise ConfigError(f"workers.{self.name}.engine", self.engine,
                              f"unknown; known: {', '.join(engine_names())}")
        if self.role not in ROLES:
            raise ConfigError(f"workers.{self.name}.role", self.role,
                              f"unknown; known: {', '.join(ROLES)}")
        for key in ("port", "kv_port", "events_port"):
            if not 0 <= getattr(self, key) < 65536:
                raise ConfigError(f"workers.{self.name}.{key}", getattr(self, key),
                                  "must be in [0, 65535]")
        if self.max_batch < 1:
            raise ConfigError(f"workers.{self.name}.max_batch", self.max_batch, "must be >= 1")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def tls_name(self) -> str | None:
        """The name its certificate carries, for server_hostname (None: plain HTTP)."""
        return self.name if self.tls else None

    @property
    def cluster(self) -> str:
        return "prfaas" if self.role == "prfaas" else "pd"

    @property
    def is_prefill(self) -> bool:
        return self.role != "pd-d"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 5.0  # opening an HTTP or KV connection
    prefill_s: float = 120.0  # one prefill request, queueing included
    kv_s: float = 120.0  # the decode worker waiting for a request's KV
    token_s: float = 60.0  # the router waiting for the next token of a running request


@dataclass(frozen=True, slots=True)
class Topology:
    name: str
    workers: tuple[WorkerSpec, ...]
    model: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields (+ `preset`)
    policy: str = "prfaas-threshold"
    policy_args: dict[str, Any] = field(default_factory=lambda: {"threshold_tokens": 1024})
    router_host: str = "127.0.0.1"
    router_port: int = 8000
    # the CPUs the router's process runs on ("1", "0-1"; None: unpinned): on a shared host, off
    # the cores of the prefill instances, whose times the simulator predicts (docs/sim-vs-live.md)
    router_cores: str | None = None
    link: LinkSpec = field(default_factory=lambda: LinkSpec(0.05, 4))
    intra_link: LinkSpec = field(default_factory=lambda: LinkSpec(None, 2))
    timeouts: Timeouts = field(default_factory=Timeouts)
    cache_capacity_bytes: int = 512 * 2**20  # per worker prefix cache
    max_retries: int = 3  # failed attempts per request retried (no token yet) or resumed
    profile: str = "cpu-tiny"  # measured engine profile (router/plan.py): name or path
    health: HealthSpec = field(default_factory=HealthSpec)  # serve/resilience.py
    restart: RestartSpec = field(default_factory=RestartSpec)
    kv_deadline: DeadlineSpec = field(default_factory=DeadlineSpec)
    admission: AdmissionSpec = field(default_factory=AdmissionSpec)
    security: SecuritySpec = field(default_factory=SecuritySpec)  # security/spec.py
    vllm: VllmSettings | None = None  # the vLLM instances' model and arguments (engine: vllm)
    plan: PlanSpec = field(default_factory=PlanSpec)  # what it was planned for (serve/planned.py)
    # the shape controller (policy/shape.py) in the router; a deployment that can restart a
    # worker in another role carries its changes out (serve/deploy/ray/shape.py)
    shape: ShapeConfig | None = None

    def __post_init__(self) -> None:
        names = [w.name for w in self.workers]
        engines = {w.engine for w in self.workers}
        if len(engines) > 1:
            raise ConfigError("workers.engine", sorted(engines), "all workers need one engine")
        if len(set(names)) != len(names):
            raise ConfigError("workers", names, "worker names must be unique")
        if not self.by_role("pd-d"):
            raise ConfigError("workers", names, "need at least one pd-d (decode) worker")
        if not self.by_role("pd-p") and not self.by_role("prfaas"):
            raise ConfigError("workers", names, "need at least one prefill worker")
        if not 0 <= self.router_port < 65536:
            raise ConfigError("router.port", self.router_port, "must be in [0, 65535]")
        if self.router_cores is not None and not parse_cores(self.router_cores):
            raise ConfigError("router.cores", self.router_cores, "names no CPU")
        if self.shape is not None and self.security.tls:
            raise ConfigError("shape", "security.tls", "role changes with TLS are not "
                              "supported: each worker's certificate and its peers' lists of "
                              "decode and prefill names are fixed at start")
        backend_class(self.engine).check(self)  # e.g. vllm: needs a `vllm:` section
        if "device" in self.model:
            check_device(self.model["device"], "model.device")
        for w in self.workers:
            if w.engine == "vllm" and w.device is not None:
                raise ConfigError(f"workers.{w.name}.device", w.device,
                                  "vLLM instances run on vllm.device (and their gpus)")
            check_worker_gpus(w.name, self.device_of(w), w.gpus, w.engine)
            if w.engine == "vllm" and w.gpus and w.cores is not None:
                raise ConfigError(f"workers.{w.name}.cores", w.cores,
                                  "a GPU instance is not pinned to CPUs (cores are for the "
                                  "CPU build)")
        supported = backend_class(self.engine).wire_dtypes
        for where, link in (("link", self.link), ("intra_link", self.intra_link)):
            if link.wire_dtype is not None and link.wire_dtype not in supported:
                raise ConfigError(f"{where}.wire_dtype", link.wire_dtype,
                                  f"engine {self.engine} ships KV as cached; it encodes "
                                  f"{', '.join(supported) or 'no wire dtype'}")

    @property
    def planned_link_gbps(self) -> float | None:
        """The inter-DC rate planned for: `plan.link_gbps`, else the emulated `link.rate_gbps`."""
        return self.plan.link_gbps or self.link.rate_gbps

    def by_role(self, role: str) -> tuple[WorkerSpec, ...]:
        return tuple(w for w in self.workers if w.role == role)

    @property
    def engine(self) -> str:
        return self.workers[0].engine

    def device_of(self, worker: WorkerSpec) -> str:
        """Where `worker` computes: its own `device`, else the topology's for its engine
        (`model.device` native, `vllm.device` vLLM), else cpu."""
        if worker.device is not None:
            return worker.device
        if worker.engine == "vllm":
            return self.vllm.device if self.vllm is not None else "cpu"
        return str(self.model.get("device", "cpu"))

    def worker(self, name: str) -> WorkerSpec:
        for w in self.workers:
            if w.name == name:
                return w
        known = [w.name for w in self.workers]
        raise ConfigError("worker", name, f"not in topology; known: {known}")

    @property
    def router_url(self) -> str:
        return f"http://{self.router_host}:{self.router_port}"

    def link_of(self, worker: WorkerSpec) -> LinkSpec:
        return self.link if worker.role == "prfaas" else self.intra_link

    def kv_dest(self, prefill: WorkerSpec, decode: WorkerSpec) -> tuple[str, int]:
        """Where `prefill` ships KV for `decode`: its KV port, or with `link.delay_stage` the
        delay stage's copy of that port inside the PrfaaS namespace (serve/deploy/delay.py)."""
        if self.link.delay_stage and prefill.role == "prfaas":
            return prefill.host, decode.kv_port
        return decode.host, decode.kv_port

    def in_namespace(self, host_ip: str, ns_ip: str) -> Topology:
        """A copy for `link.emulation: netns`: PrfaaS workers at the namespace's address,
        decode workers at the host end of the veth (reachable from both sides)."""
        moved = {"prfaas": ns_ip, "pd-d": host_ip}
        return replace(self, workers=tuple(replace(w, host=moved.get(w.role, w.host))
                                           for w in self.workers))

    def with_security(self, security: SecuritySpec) -> Topology:
        """A copy with `security` in force (its PrfaaS workers' control API HTTPS with TLS)."""
        return replace(self, security=security, workers=tuple(
            replace(w, tls=security.tls and w.role == "prfaas") for w in self.workers))

    def with_ports(self) -> Topology:
        """A copy with every port 0 replaced by a currently free port."""
        events = self.vllm is not None and self.vllm.kv_events
        workers = tuple(replace(w, port=w.port or free_port(w.host),
                                kv_port=(w.kv_port or free_port(w.host)) if w.role == "pd-d" else 0,
                                events_port=(w.events_port or free_port(w.host))
                                if events and w.engine == "vllm" else w.events_port)
                        for w in self.workers)
        return replace(self, workers=workers,
                       router_port=self.router_port or free_port(self.router_host))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "model": dict(self.model),
            "policy": {"name": self.policy, **self.policy_args},
            "router": {"host": self.router_host, "port": self.router_port,
                       **({"cores": self.router_cores} if self.router_cores is not None else {})},
            "link": {"rate_gbps": self.link.rate_gbps, "connections": self.link.connections,
                     "emulation": self.link.emulation, "delay_stage": self.link.delay_stage,
                     **_wire(self.link)},
            "intra_link": {"rate_gbps": self.intra_link.rate_gbps,
                           "connections": self.intra_link.connections, **_wire(self.intra_link)},
            "timeouts": {k: getattr(self.timeouts, k) for k in Timeouts.__dataclass_fields__},
            "cache": {"capacity_mb": self.cache_capacity_bytes / 2**20},
            "max_retries": self.max_retries, "profile": self.profile,
            "health": to_dict(self.health), "restart": to_dict(self.restart),
            "kv_deadline": to_dict(self.kv_deadline), "admission": to_dict(self.admission),
            "security": self.security.to_dict(),
            "workers": [{"name": w.name, "role": w.role, "host": w.host, "port": w.port,
                         "kv_port": w.kv_port, "max_batch": w.max_batch,
                         **({"engine": w.engine, "cores": w.cores, "vllm_args": list(w.vllm_args),
                             "events_port": w.events_port}
                            if w.engine != DEFAULT_ENGINE else {}),
                         **({"device": w.device} if w.device is not None else {}),
                         **({"gpus": list(w.gpus)} if w.gpus else {})} for w in self.workers],
            **({"vllm": self.vllm.to_dict()} if self.vllm is not None else {}),
            **({"plan": self.plan.to_dict()} if self.plan.to_dict() else {}),
            **({"shape": asdict(self.shape)} if self.shape is not None else {}),
        }

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _wire(link: LinkSpec) -> dict[str, str]:
    out = {"wire_dtype": link.wire_dtype} if link.wire_dtype is not None else {}
    return {**out, "compression": link.compression} if link.compression != "none" else out


def _link(raw: object, where: str, default: LinkSpec) -> LinkSpec:
    m = _mapping(raw, where)
    _keys(m, {"rate_gbps", "connections", "emulation", "delay_stage", "wire_dtype",
              "compression"}, where)
    rate = m.get("rate_gbps", default.rate_gbps)
    emulation = str(m.get("emulation", default.emulation))
    if where == "intra_link" and emulation != "token-bucket":
        raise ConfigError("intra_link.emulation", emulation, "only the inter-DC link can be netns")
    return LinkSpec(None if rate is None else float(rate),
                    int(m.get("connections", default.connections)), emulation,
                    bool(m.get("delay_stage", False)),
                    wire_dtype_name(m.get("wire_dtype")),
                    _compression(m.get("compression", default.compression), where))


def _compression(raw: object, where: str) -> str:
    if raw is None:  # `compression: null`
        return "none"
    if raw not in COMPRESSION_MODES:
        raise ConfigError(f"{where}.compression", raw,
                          f"must be one of {', '.join(COMPRESSION_MODES)}")
    return str(raw)


def _worker(raw: object, index: int, default_engine: str) -> WorkerSpec:
    m = _mapping(raw, f"workers[{index}]")
    _keys(m, {"name", "role", "host", "port", "kv_port", "max_batch", "engine", "cores",
              "vllm_args", "events_port", "device", "gpus"}, f"workers[{index}]")
    if "name" not in m or "role" not in m:
        raise ConfigError(f"workers[{index}]", m, "needs a name and a role")
    cores, device = m.get("cores"), m.get("device")
    return WorkerSpec(str(m["name"]), m["role"], str(m.get("host", "127.0.0.1")),
                      int(m.get("port", 0)), int(m.get("kv_port", 0)), int(m.get("max_batch", 16)),
                      engine=str(m.get("engine", default_engine)),
                      cores=None if cores is None else str(cores),
                      vllm_args=tuple(str(a) for a in m.get("vllm_args", ())),
                      events_port=int(m.get("events_port", 0)),
                      device=None if device is None else check_device(
                          device, f"workers.{m['name']}.device"),
                      gpus=parse_gpus(m.get("gpus"), f"workers.{m['name']}.gpus"))


def _profile(top: object, in_policy: object, base: Path | None) -> str:
    """The profile reference: `policy.profile` or top-level `profile` (not both); a path is
    made absolute against the topology file's folder, so a dumped copy still finds it."""
    if top is not None and in_policy is not None:
        raise ConfigError("policy.profile", in_policy, "also given as top-level `profile`")
    ref = in_policy if in_policy is not None else top
    if ref is None:
        return "cpu-tiny"
    if not isinstance(ref, str) or not ref:
        raise ConfigError("profile", ref, "must be a profile name or a file path")
    if ("/" in ref or ref.endswith((".yaml", ".yml"))) and not Path(ref).is_absolute():
        return str(((base or Path.cwd()) / ref).resolve())
    return ref


RESILIENCE_KEYS: dict[str, Any] = {"health": HealthSpec, "restart": RestartSpec,
                                   "kv_deadline": DeadlineSpec, "admission": AdmissionSpec}


def parse_topology(raw: object, where: str = "topology", base: Path | None = None) -> Topology:
    """`base`: the folder relative profile paths are read from (the topology file's)."""
    m = _mapping(raw, where)
    _keys(m, {"name", "model", "policy", "router", "link", "intra_link", "timeouts", "cache",
              "max_retries", "workers", "profile", "security", "vllm", "plan", "shape",
              *RESILIENCE_KEYS},
             where)
    policy = dict(_mapping(m.get("policy"), "policy")) or {"name": "prfaas-threshold",
                                                          "threshold_tokens": 1024}
    profile = _profile(m.get("profile"), policy.pop("profile", None), base)
    router = _mapping(m.get("router"), "router")
    _keys(router, {"host", "port", "cores"}, "router")
    timeouts = _mapping(m.get("timeouts"), "timeouts")
    _keys(timeouts, set(Timeouts.__dataclass_fields__), "timeouts")
    cache = _mapping(m.get("cache"), "cache")
    _keys(cache, {"capacity_mb"}, "cache")
    workers = m.get("workers")
    if not isinstance(workers, list) or not workers:
        raise ConfigError("workers", workers, "must be a non-empty list")
    model = dict(_mapping(m.get("model"), "model"))
    # a worker without `engine:` runs the model's `backend` (the emulated topologies' form)
    default_engine = str(model.get("backend", DEFAULT_ENGINE))
    specs = tuple(_worker(w, i, default_engine) for i, w in enumerate(workers))
    security = parse_security(m.get("security"), base,
                              [w.host for w in specs if w.role == "prfaas"],
                              [w.host for w in specs if w.role != "prfaas"])
    specs = tuple(replace(w, tls=security.tls and w.role == "prfaas") for w in specs)
    return Topology(
        name=str(m.get("name", "topology")),
        workers=specs, security=security,
        model=model,
        policy=str(policy.pop("name", "prfaas-threshold")), policy_args=policy,
        router_host=str(router.get("host", "127.0.0.1")), router_port=int(router.get("port", 8000)),
        router_cores=None if router.get("cores") is None else str(router["cores"]),
        link=_link(m.get("link"), "link", LinkSpec(0.05, 4)),
        intra_link=_link(m.get("intra_link"), "intra_link", LinkSpec(None, 2)),
        timeouts=Timeouts(**{k: float(v) for k, v in timeouts.items()}),
        cache_capacity_bytes=int(float(cache.get("capacity_mb", 512)) * 2**20),
        max_retries=int(m.get("max_retries", 3)), profile=profile,
        **{key: parse_spec(cls, m.get(key), key) for key, cls in RESILIENCE_KEYS.items()},
        vllm=parse_vllm(m.get("vllm"), base),
        plan=parse_plan(m.get("plan")),
        shape=None if m.get("shape") is None else ShapeConfig.from_dict(m["shape"]),
    )


def load_topology(path: str | Path | None = None) -> Topology:
    """Read a topology file; None = the embedded `local.yaml`."""
    if path is None:
        text = resources.files("prfaas.data").joinpath("topologies", DEFAULT_TOPOLOGY).read_text()
        where = DEFAULT_TOPOLOGY
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("topology", str(path), "no such file")
        text, where = read_text(p, "topology"), str(p)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("topology", where, f"invalid YAML: {exc}") from exc
    return parse_topology(raw, where, None if path is None else Path(path).parent)
