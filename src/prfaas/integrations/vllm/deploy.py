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
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.kv_events import events_config
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
                    cores=worker.cores, args=(*s.args, *worker.vllm_args, *events))


def exec_worker(topology: Topology, name: str) -> None:
    spec = worker_spec(topology, topology.worker(name))
    trace = os.environ.get("PRFAAS_VLLM_TRACE_DIR")
    if trace:  # per-layer send/receive timestamps for tests and benchmarks
        spec = worker_spec(topology, topology.worker(name),
                           {"trace_path": os.path.join(trace, f"{name}.trace")})
    cmd = spec.command()
    os.execve(cmd[0], cmd, spec.environ())


def prepare(topology: Topology) -> None:
    """Before the instances start: build the topology's tiny model if it is missing."""
    from prfaas.integrations.vllm.model_builder import ensure_model

    s = settings(topology)
    ensure_model(s.arch, s.model_dir, s.model_seed)
