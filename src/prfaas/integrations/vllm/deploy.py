"""A topology's `engine: vllm` worker as a vLLM server command (no vLLM import here).

Roles map to connector roles: `prfaas` and `pd-p` are producers whose sender shapes itself to
the worker's link (`link` for PrfaaS, `intra_link` for PD-P: topology.link_of), `pd-d` is the
consumer whose receiver listens on the worker's `kv_port`. `exec_worker` replaces the calling
process (`python -m prfaas.serve.deploy.proc --name W`) with the vLLM server, so the launcher's pid,
SIGTERM and /health work on it unchanged.
"""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.kv_events import events_config
from prfaas.integrations.vllm.kv_security import FAULT_ENV
from prfaas.integrations.vllm.server import VllmSpec
from prfaas.serve.topology import Topology, WorkerSpec
from prfaas.serve.vllm_settings import VllmSettings


def settings(topology: Topology) -> VllmSettings:
    if topology.vllm is None:
        raise ConfigError("vllm", None, f"topology {topology.name!r} has no `vllm:` section")
    return topology.vllm


def worker_spec(topology: Topology, worker: WorkerSpec,
                extra: dict[str, Any] | None = None) -> VllmSpec:
    s = settings(topology)
    link = topology.link_of(worker)
    if worker.role == "pd-d":
        role = "kv_consumer"
        conf: dict[str, Any] = {"kv_host": worker.host, "kv_port": worker.kv_port,
                                "frame_timeout_s": topology.timeouts.kv_s}
    else:
        role = "kv_producer"
        conf = {"rate_gbps": link.sender_rate_gbps, "connections": link.connections}
    conf.update(tls_extra(topology, worker))
    conf.update(extra or {})
    events: tuple[str, ...] = ()
    if s.kv_events:  # the router subscribes to them (kv_events.py)
        if not worker.events_port:
            raise ConfigError(f"workers.{worker.name}.events_port", worker.events_port,
                              "vllm.kv_events needs a port to publish on (0 is resolved by "
                              "the launcher)")
        events = ("--kv-events-config",
                  json.dumps(events_config(worker.events_port, worker.name)))
    return VllmSpec(s.model_dir, worker.port, worker.host, s.served_name, role, conf,  # type: ignore[arg-type]
                    max_model_len=s.max_model_len,
                    max_num_batched_tokens=s.max_num_batched_tokens, kv_cache_gib=s.kv_cache_gib,
                    cores=worker.cores,
                    args=(*s.args, *worker.vllm_args, *events, *https_args(topology, worker)))


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


def https_args(topology: Topology, worker: WorkerSpec) -> tuple[str, ...]:
    """vLLM's own HTTPS with required client certificates of the topology's CA, for a worker
    the router calls over mutual TLS (a PrfaaS instance when the topology has TLS)."""
    tls_dir = topology.security.tls_dir
    if tls_dir is None or not worker.tls:
        return ()
    d = Path(tls_dir)
    return ("--ssl-keyfile", str(d / f"{worker.name}.key"),
            "--ssl-certfile", str(d / f"{worker.name}.pem"), "--ssl-ca-certs", str(d / "ca.pem"),
            "--ssl-cert-reqs", str(int(ssl.CERT_REQUIRED)))


def exec_worker(topology: Topology, name: str) -> None:
    extra: dict[str, Any] = {}
    trace = os.environ.get("PRFAAS_VLLM_TRACE_DIR")
    if trace:  # per-layer send/receive timestamps for tests and benchmarks
        extra["trace_path"] = os.path.join(trace, f"{name}.trace")
    faults = os.environ.get(FAULT_ENV)
    if faults:  # tests: a tampered transfer on demand (kv_security.take_fault)
        extra["fault_file"] = os.path.join(faults, f"{name}.fault")
    spec = worker_spec(topology, topology.worker(name), extra)
    cmd = spec.command()
    spec.pin()  # the whole instance on its cores (server.py: VllmSpec.cpu_set)
    os.execve(cmd[0], cmd, spec.environ())


def prepare(topology: Topology) -> None:
    """Before the instances start: build the topology's tiny model if it is missing."""
    from prfaas.integrations.vllm.model_builder import ensure_model

    s = settings(topology)
    ensure_model(s.arch, s.model_dir, s.model_seed)
