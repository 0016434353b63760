"""The single-instance reference: one standalone vLLM engine (no connector) on the same model
with the same engine arguments as the topology's instances, greedy. `prfaas generate --engine
vllm` prints its answer; tests compare every routed answer with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prfaas.core.errors import PrfaasError
from prfaas.integrations.vllm.server import VllmInstance, VllmSpec
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.ports import free_port
from prfaas.serve.topology import Topology
from prfaas.serve.vllm_settings import VllmSettings


@contextlib.contextmanager
def deployment_with_reference(topo: Topology, log_dir: Path, with_reference: bool = True,
                              start_timeout_s: float = 900.0
                              ) -> Iterator[tuple[Deployment, VllmInstance | None, Path]]:
    """The topology's instances + router, their connectors tracing into `log_dir/traces`
    (PRFAAS_VLLM_TRACE_DIR while it runs), and, started alongside on one core, the standalone
    reference on the same model; yields when all are ready, stops all on exit."""
    trace_dir = log_dir / "traces"
    trace_dir.mkdir(parents=True, exist_ok=True)
    ref: VllmInstance | None = None
    if with_reference:
        assert topo.vllm is not None
        ref = VllmInstance(reference_spec(topo.vllm, free_port(), cores="1"),
                           log_dir / "reference.log")
        ref.spawn()
    os.environ["PRFAAS_VLLM_TRACE_DIR"] = str(trace_dir)
    dep = Deployment(topo, log_dir, start_timeout_s=start_timeout_s)
    try:
        dep.start()
        if ref is not None:
            ref.wait_ready(start_timeout_s)
        yield dep, ref, trace_dir
    finally:
        os.environ.pop("PRFAAS_VLLM_TRACE_DIR", None)
        dep.stop(timeout_s=30)
        if ref is not None:
            ref.stop()


def reference_spec(s: VllmSettings, port: int, cores: str | None = None,
                   idle_spin_s: float | None = None, gpus: tuple[int, ...] = (),
                   gpu_memory_utilization: float | None = None) -> VllmSpec:
    """A standalone instance of the topology's model; on `vllm.device: cuda` on `gpus`
    (default GPU 0) and never pinned to `cores`."""
    gpu = s.device == "cuda"
    return VllmSpec(s.model_dir, port, served_name=s.served_name, kv_role=None,
                    max_model_len=s.max_model_len, max_num_batched_tokens=s.max_num_batched_tokens,
                    kv_cache_gib=s.kv_cache_gib, cores=None if gpu else cores, args=s.args,
                    idle_spin_s=idle_spin_s, device=s.device,
                    gpus=(gpus or (0,)) if gpu else (),
                    gpu_memory_utilization=gpu_memory_utilization if gpu else None)


def complete(url: str, served_name: str, prompt: str | list[int], max_tokens: int,
             timeout_s: float = 300.0, **extra: Any) -> dict[str, Any]:
    """POST /v1/completions (greedy unless `extra` says otherwise); the choice, with
    `token_ids` and `prompt_token_ids`."""
    body = {"model": served_name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True, **extra}
    status, reply = post_completion(url, body, timeout_s)
    if status != 200:
        raise PrfaasError(f"vLLM answered HTTP {status}: {str(reply)[:300]}")
    choice: dict[str, Any] = reply["choices"][0]
    return choice


def post_completion(url: str, body: dict[str, Any],
                    timeout_s: float = 600.0) -> tuple[int, dict[str, Any]]:
    """POST `body` to `url`/v1/completions (a vLLM instance or a prfaas router): the HTTP status
    and the JSON reply; an error body that is not JSON comes back as {"error": its text}."""
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            reply: dict[str, Any] = json.loads(resp.read())
            return resp.status, reply
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            parsed: dict[str, Any] = json.loads(raw or b"{}")
        except ValueError:
            parsed = {"error": raw[:500].decode(errors="replace")}
        return err.code, parsed


def generate(s: VllmSettings, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
    """Start a standalone instance, answer one prompt greedily, stop it."""
    with tempfile.TemporaryDirectory(prefix="prfaas-vllm-ref-") as tmp:
        inst = VllmInstance(reference_spec(s, free_port()), Path(tmp) / "vllm.log")
        with inst:
            choice = complete(inst.spec.url, s.served_name, prompt, max_tokens)
    return {"text": choice.get("text", ""), "token_ids": choice.get("token_ids", []),
            "prompt_tokens": len(choice.get("prompt_token_ids") or []),
            "model": s.model_dir, "engine": "vllm", "finish_reason": choice.get("finish_reason")}
