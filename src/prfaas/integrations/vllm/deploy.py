"""A topology's `engine: vllm` worker as a vLLM server command (no vLLM import here).

Roles map to connector roles: `prfaas` and `pd-p` are producers whose sender shapes itself to
the worker's link (`link` for PrfaaS, `intra_link` for PD-P: topology.link_of), `pd-d` is the
consumer whose receiver listens on the worker's `kv_port`. `exec_worker` replaces the calling
process (`python -m prfaas.serve.deploy.proc --name W`) with the vLLM server, so the launcher's pid,
SIGTERM and /health work on it unchanged.
"""

from __future__ import annotations

import os
from typing import Any

from prfaas.core.errors import ConfigError
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
    return VllmSpec(s.model_dir, worker.port, worker.host, s.served_name, role, conf,  # type: ignore[arg-type]
                    max_model_len=s.max_model_len,
                    max_num_batched_tokens=s.max_num_batched_tokens, kv_cache_gib=s.kv_cache_gib,
                    cores=worker.cores, args=(*s.args, *worker.vllm_args))


def exec_worker(topology: Topology, name: str) -> None:
    spec = worker_spec(topology, topology.worker(name))
    trace = os.environ.get("PRFAAS_VLLM_TRACE_DIR")
    if trace:  # per-layer send/receive timestamps for tests and benchmarks
        spec = worker_spec(topology, topology.worker(name),
                           {"trace_path": os.path.join(trace, f"{name}.trace")})
    cmd = spec.command()
    os.execve(cmd[0], cmd, spec.environ())


def router_service(topology: Topology, api_key: str | None = None) -> Any:
    """The router in front of vLLM instances: the model's own tokenizer, the vLLM backend
    (`api_key`: clients must send it, as on the native path)."""
    from prfaas.integrations.vllm.served_model import ServedModel
    from prfaas.models.kv import geometry
    from prfaas.serve.router.service import RouterService

    model = ServedModel.from_settings(settings(topology))
    geo = geometry(model.to_spec())
    return RouterService(topology, model, api_key=api_key,  # type: ignore[arg-type]
                         tokenizer=model.tokenizer(), backend="vllm",
                         backend_args={"served_name": model.name,
                                       "block_size_tokens": model.block_size_tokens,
                                       "kv_bytes_per_token": geo.kv_bytes_per_token,
                                       "kv_fixed_bytes": int(geo.linear_state_bytes)})


def prepare(topology: Topology) -> None:
    """Before the instances start: build the topology's tiny model if it is missing."""
    from prfaas.integrations.vllm.model_builder import ensure_model

    s = settings(topology)
    ensure_model(s.arch, s.model_dir, s.model_seed)
