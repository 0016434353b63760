"""Start and stop one vLLM OpenAI server (CPU build here, CUDA elsewhere) with PrfaasConnector.

A spec on `device: cuda` is the CUDA build's command: its GPUs as CUDA_VISIBLE_DEVICES (mapped
through the caller's own, serve/gpus.py), `--gpu-memory-utilization`, `--tensor-parallel-size`
for several GPUs, and none of the CPU build's settings (core pinning, VLLM_CPU_KVCACHE_SPACE,
VLLM_CPU_OMP_THREADS_BIND).

`VllmInstance(spec).start()` spawns `python -m vllm.entrypoints.openai.api_server` (the module
form works without the `vllm` metadata shim; `launch.py` in its place when the spec sets vLLM's
idle spin, `idle_spin_s`, or receives KV: stream_params.py) in its own process group, logs to a
file, and
waits until `/v1/models` answers (every probe has a timeout: a probe without one was seen to
hang for minutes). `stop()` sends SIGTERM to the group (API server, EngineCore and Worker),
waits, then SIGKILLs it. Nothing here imports vLLM: the router and tests use it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prfaas.core.errors import ConfigError, PrfaasError
from prfaas.serve.cores import parse_cores, pin
from prfaas.serve.gpus import gpu_env
from prfaas.serve.vllm_settings import check_idle_spin

KvRole = Literal["kv_producer", "kv_consumer", "kv_both"]
CONNECTOR_MODULE = "prfaas.integrations.vllm.connector"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LAUNCH_MODULE = "prfaas.integrations.vllm.launch"
RPC_DIR_ENV = "VLLM_RPC_BASE_PATH"
IDLE_SPIN_ENV = "PRFAAS_VLLM_IDLE_SPIN_S"  # read by launch.py (it imports vLLM; this must not)
PINNED_SPIN_S = 0.01  # `idle_spin_s: auto` for an instance pinned to `cores` (deploy.py)


class VllmStartError(PrfaasError):
    """A vLLM instance exited or did not answer in time; carries its log tail."""


@dataclass(frozen=True, slots=True)
class VllmSpec:
    model_dir: str
    port: int
    host: str = "127.0.0.1"
    served_name: str = "tiny"
    kv_role: KvRole | None = None  # None: no connector (the standalone reference engine)
    extra: dict[str, Any] = field(default_factory=dict)  # kv_connector_extra_config
    connector: str = "PrfaasConnector"
    connector_module: str | None = CONNECTOR_MODULE  # None: a connector built into vLLM
    max_model_len: int = 4096
    max_num_batched_tokens: int = 1024
    kv_cache_gib: int = 1
    cores: str | None = None  # e.g. "0" or "0-1": every process of the instance (cpu_set)
    args: tuple[str, ...] = ("--enforce-eager",)
    env: dict[str, str] = field(default_factory=dict)
    # vLLM's ZMQ IPC sockets (VLLM_RPC_BASE_PATH): None: VllmInstance makes a temp folder and
    # removes it on stop (vLLM's default, the system temp folder, keeps a socket file for
    # every instance that was killed)
    rpc_dir: str | None = None
    idle_spin_s: float | None = None  # None: vLLM's own (1 s); else launch.py sets it
    device: str = "cpu"  # cpu: the vllm-cpu build; cuda: the CUDA build, on `gpus`
    gpus: tuple[int, ...] = ()  # cuda: the caller's GPU indices (CUDA_VISIBLE_DEVICES)
    gpu_memory_utilization: float | None = None  # cuda: vLLM's default (0.9) when None

    def __post_init__(self) -> None:
        check_idle_spin(self.idle_spin_s, "idle_spin_s")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "must be cpu or cuda")
        if self.on_gpu and self.cores is not None:
            raise ConfigError("cores", self.cores, "a GPU instance is not pinned to CPUs")
        if not self.on_gpu and (self.gpus or self.gpu_memory_utilization is not None):
            raise ConfigError("gpus", list(self.gpus), "GPU settings on a cpu instance")

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def kv_config(self) -> dict[str, Any] | None:
        if self.kv_role is None:
            return None
        cfg: dict[str, Any] = {"kv_connector": self.connector, "kv_role": self.kv_role,
                               "kv_connector_extra_config": dict(self.extra)}
        if self.connector_module:
            cfg["kv_connector_module_path"] = self.connector_module
        return cfg

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", self.server_module(),
               "--model", self.model_dir, "--host", self.host, "--port", str(self.port),
               "--served-model-name", self.served_name, "--max-model-len",
               str(self.max_model_len), "--max-num-batched-tokens",
               str(self.max_num_batched_tokens), "--seed", "0",
               "--enable-prompt-tokens-details", *self.args]  # usage reports cached tokens
        if self.on_gpu:
            if self.gpu_memory_utilization is not None:
                cmd += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:.4g}"]
            if len(self.gpus) > 1 and not _has_flag(self.args, "--tensor-parallel-size", "-tp"):
                cmd += ["--tensor-parallel-size", str(len(self.gpus))]
        kv = self.kv_config()
        if kv is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv)]
        return cmd

    def server_module(self) -> str:
        """vLLM's server module, or ours (launch.py: vLLM's server with its idle spin set, and
        for an instance that receives KV, its wire-byte count at the end of each stream)."""
        receives = self.kv_role in ("kv_consumer", "kv_both")
        return LAUNCH_MODULE if self.idle_spin_s is not None or receives else SERVER_MODULE

    def cpu_set(self) -> set[int] | None:
        """The CPUs the whole instance runs on (API server, EngineCore, Worker and their
        threads), not only vLLM's OMP compute threads (VLLM_CPU_OMP_THREADS_BIND): a vLLM
        EngineCore steps in a busy loop while a request waits for its KV, and unpinned, the
        decoder's loop ran on the prefill instances' core (docs/sim-vs-live.md, "On vLLM")."""
        return parse_cores(self.cores)

    def pin(self) -> None:
        """Pin the calling process (before it execs the server: children inherit it)."""
        pin(self.cores)

    def environ(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.on_gpu:
            for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                         "VLLM_CPU_NUM_OF_RESERVED_CPU"):
                env.pop(name, None)
            env.update(gpu_env(self.gpus, os.environ))
        else:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        if self.cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cores
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        if self.idle_spin_s is not None:
            env[IDLE_SPIN_ENV] = repr(float(self.idle_spin_s))
        if self.rpc_dir is not None:
            env[RPC_DIR_ENV] = self.rpc_dir
        env.update(self.env)
        return env


def _has_flag(args: tuple[str, ...], *names: str) -> bool:
    return any(a in names or a.split("=", 1)[0] in names for a in args)


class VllmInstance:
    def __init__(self, spec: VllmSpec, log_path: str | Path) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self._rpc_tmp: str | None = None  # the temp folder spawn made for rpc_dir, if any

    def __enter__(self) -> VllmInstance:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.spec.environ()
        if self.spec.rpc_dir is None and RPC_DIR_ENV not in env:  # (set by the caller: theirs)
            if self._rpc_tmp is None:  # a respawn after kill() reuses it
                self._rpc_tmp = tempfile.mkdtemp(prefix="prfaas-vllm-rpc-")
            env[RPC_DIR_ENV] = self._rpc_tmp
        log = open(self.log_path, "wb")  # noqa: SIM115 (owned by the child)
        self.proc = subprocess.Popen(self.spec.command(), stdout=log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True,
                                     preexec_fn=self.spec.pin)
        log.close()

    def start(self, timeout_s: float = 300.0) -> None:
        if self.proc is None:
            self.spawn()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready(self.spec.url):
            if self.proc is not None and self.proc.poll() is not None:
                raise VllmStartError(f"vLLM on port {self.spec.port} exited with code "
                                     f"{self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise VllmStartError(f"vLLM on port {self.spec.port} not ready after "
                                     f"{timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, num_bytes: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-num_bytes:].decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, for fault tests)."""
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        _reap_group(self.proc.pid)
        self.proc = None
        if self._rpc_tmp is not None:
            shutil.rmtree(self._rpc_tmp, ignore_errors=True)
            self._rpc_tmp = None


def _reap_group(pgid: int) -> None:
    """SIGKILL what is left of the group (vLLM's EngineCore/Worker children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
