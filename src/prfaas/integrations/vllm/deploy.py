"""A topology's `engine: vllm` worker as a vLLM server command (no vLLM import here).

Roles map to connector roles: `prfaas` and `pd-p` are producers whose sender shapes itself to
the worker's link (`link` for PrfaaS, `intra_link` for PD-P: topology.link_of) and encodes the
link's `wire_dtype`; `pd-d` is the consumer whose receiver listens on the worker's `kv_port`.
`exec_worker` replaces the calling process (`python -m prfaas.serve.deploy.proc --name W`) with
the vLLM server, so the launcher's pid, SIGTERM and /health work on it unchanged. With TLS, a
PrfaaS worker's port belongs to the TLS front (tls_front.py, a child started first) and vLLM
serves on a unix socket behind it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.kv_events import endpoints, events_config
from prfaas.integrations.vllm.kv_security import FAULT_ENV
from prfaas.integrations.vllm.server import PINNED_SPIN_S, VllmSpec, parse_cores
from prfaas.integrations.vllm.tls_front import start_front
from prfaas.serve.engines import RUN_DIR_ENV
from prfaas.serve.topology import Topology, WorkerSpec
from prfaas.serve.vllm_settings import GPU_MEMORY_SHARE, VllmSettings


def settings(topology: Topology) -> VllmSettings:
    if topology.vllm is None:
        raise ConfigError("vllm", None, f"topology {topology.name!r} has no `vllm:` section")
    return topology.vllm


def worker_spec(topology: Topology, worker: WorkerSpec,
                extra: dict[str, Any] | None = None, uds: str | None = None) -> VllmSpec:
    """`uds`: vLLM serves its API on this unix socket instead of the worker's port (behind
    the TLS front, tls_front.py; `needs_front`)."""
    s = settings(topology)
    link = topology.link_of(worker)
    if worker.role == "pd-d":
        role = "kv_consumer"
        conf: dict[str, Any] = {"kv_host": worker.host, "kv_port": worker.kv_port,
                                "frame_timeout_s": topology.timeouts.kv_s}
    else:
        role = "kv_producer"
        conf = {"rate_gbps": link.sender_rate_gbps, "connections": link.connections}
        if link.compression != "none":  # the connector's KVSender compresses (transport/codec.py)
            conf.update(compression=link.compression, link_rate_gbps=link.rate_gbps)
        if link.wire_dtype is not None:  # full-attention KV in fp8 on this link (wire_quant.py)
            conf["wire_dtype"] = link.wire_dtype
    conf.update(tls_extra(topology, worker))
    conf.update(extra or {})
    events: tuple[str, ...] = ()
    if s.kv_events:  # the router subscribes to them (kv_events.py)
        publish, _ = endpoints(worker.name, worker.host, worker.events_port, s.events_dir,
                               topology.security.tls)
        if publish.startswith("tcp://") and not worker.events_port:
            raise ConfigError(f"workers.{worker.name}.events_port", worker.events_port,
                              "vllm.kv_events needs a port to publish on (0 is resolved by "
                              "the launcher)")
        events = ("--kv-events-config", json.dumps(events_config(publish, worker.name)))
    return VllmSpec(s.model_dir, worker.port, worker.host, s.served_name, role, conf,  # type: ignore[arg-type]
                    max_model_len=s.max_model_len,
                    max_num_batched_tokens=s.max_num_batched_tokens, kv_cache_gib=s.kv_cache_gib,
                    cores=worker.cores, idle_spin_s=idle_spin_s(topology, worker),
                    args=(*s.args, *worker.vllm_args, *events, *(("--uds", uds) if uds else ())),
                    device=s.device, gpus=worker.gpus,
                    gpu_memory_utilization=gpu_memory_utilization(topology, worker))


def gpu_memory_utilization(topology: Topology, worker: WorkerSpec) -> float | None:
    """A GPU instance's --gpu-memory-utilization: the topology's number, or with `auto`
    GPU_MEMORY_SHARE divided by the most instances on this host that share one of its GPUs
    (two instances on GPU 0: 0.45 each); None on the CPU."""
    s = settings(topology)
    if s.device != "cuda":
        return None
    if s.gpu_memory_utilization is not None:
        return s.gpu_memory_utilization
    sharing = max(sum(1 for w in topology.workers if w.engine == "vllm" and w.host == worker.host
                      and gpu in w.gpus) for gpu in worker.gpus)
    return round(GPU_MEMORY_SHARE / max(sharing, 1), 4)


def idle_spin_s(topology: Topology, worker: WorkerSpec) -> float | None:
    """The worker's vLLM idle spin (vllm_settings.py, `idle_spin_s`): the topology's number,
    or with `auto`, PINNED_SPIN_S for a worker pinned to `cores` (its EngineCore spins on the
    cores its Worker computes on, and on those of any worker pinned beside it) and None
    (vLLM's own 1 s) for an unpinned one (a GPU host: the spin costs a spare host core)."""
    s = settings(topology)
    if s.idle_spin_s is not None:
        return s.idle_spin_s
    return None if parse_cores(worker.cores) is None else PINNED_SPIN_S


def tls_extra(topology: Topology, worker: WorkerSpec) -> dict[str, Any]:
    """The connector's TLS settings (kv_security.ConnectorTls): its certificate, and the peers
    of the topology it may talk KV with, a producer's by KV address, a consumer's by name."""
    tls_dir = topology.security.tls_dir
    if tls_dir is None:
        return {}
    if worker.role == "pd-d":
        return {"tls_dir": tls_dir, "tls_name": worker.name,
                "senders": sorted(w.name for w in topology.workers if w.is_prefill)}
    decoders = {}
    for d in topology.by_role("pd-d"):
        host, port = topology.kv_dest(worker, d)
        decoders[f"{host}:{port}"] = d.name
    return {"tls_dir": tls_dir, "tls_name": worker.name, "decoders": decoders}


def needs_front(topology: Topology, worker: WorkerSpec) -> bool:
    """A worker the router calls over mutual TLS (a PrfaaS instance when the topology has TLS):
    its port is the TLS front's, which opens only to the router's certificate (tls_front.py;
    vLLM's own --ssl-* options would let any certificate of the topology's CA in)."""
    return topology.security.tls_dir is not None and worker.tls


def rpc_dir(name: str, environ: Mapping[str, str]) -> str | None:
    """Where worker `name` keeps vLLM's ZMQ IPC sockets: in the deployment's private folder
    (RUN_DIR_ENV, removed by the launcher on stop), made here; None outside a launcher
    (vLLM's default, the system temp folder)."""
    run_dir = environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    path = os.path.join(run_dir, f"vllm-rpc-{name}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def exec_worker(topology: Topology, name: str) -> None:
    extra: dict[str, Any] = {}
    trace = os.environ.get("PRFAAS_VLLM_TRACE_DIR")
    if trace:  # per-layer send/receive timestamps for tests and benchmarks
        extra["trace_path"] = os.path.join(trace, f"{name}.trace")
    faults = os.environ.get(FAULT_ENV)
    if faults:  # tests: a tampered transfer on demand (kv_security.take_fault)
        extra["fault_file"] = os.path.join(faults, f"{name}.fault")
    worker = topology.worker(name)
    uds = None
    if needs_front(topology, worker):
        assert topology.security.tls_dir is not None
        uds, _ = start_front(topology.security.tls_dir, name, worker.host, worker.port)
    spec = worker_spec(topology, worker, extra, uds)
    spec = dataclasses.replace(spec, rpc_dir=rpc_dir(name, os.environ))
    cmd = spec.command()
    spec.pin()  # the whole instance on its cores (server.py: VllmSpec.cpu_set)
    os.execve(cmd[0], cmd, spec.environ())


def prepare(topology: Topology) -> None:
    """Before the instances start: build the topology's tiny model if it is missing."""
    from prfaas.integrations.vllm.model_builder import ensure_model

    s = settings(topology)
    ensure_model(s.arch, s.model_dir, s.model_seed, s.model_weights)
