"""The `vllm:` section of a topology whose workers run `engine: vllm` (docs/vllm.md).

```yaml
vllm:
  model: {arch: llama, dir: out/vllm-models/llama, seed: 0}  # built by `prfaas serve` if missing
  served_name: tiny
  max_model_len: 4096
  max_num_batched_tokens: 1024   # prompts longer than this are prefilled in chunks
  kv_cache_gib: 1                # VLLM_CPU_KVCACHE_SPACE (the CPU build's KV cache)
  block_size_tokens: 128         # the router hashes prompts in blocks of this size
  args: ["--enforce-eager"]      # more vLLM server arguments, for every instance
  kv_events: false               # true: the router's prefix state comes from vLLM's KV events
  events_dir: null               # publish them on unix sockets here, not TCP (below)
  idle_spin_s: auto              # a vLLM process's spin after each queue read (below)
  device: cpu                    # cpu (the vllm-cpu build) or cuda (the CUDA `vllm` build)
  gpu_memory_utilization: auto   # on cuda: --gpu-memory-utilization of every instance
```
With `kv_events: true` each instance publishes its KV cache events (BlockStored, BlockRemoved,
AllBlocksCleared) on its worker's `events_port` and the router subscribes to them
(integrations/vllm/kv_events.py): evictions are then tracked. Without, the router infers the
state from the requests it sent (every full block of a prompt an instance computed or
received), which never sees an eviction.
`events_dir`: the instances publish on unix sockets (`ipc://DIR/<worker>.events`) instead of
TCP ports. vLLM's publisher (ZMQ) has no TLS and no authentication and its events carry the
prompts' token ids, so with `security.tls` on, events travel only this way: the launcher makes
a private folder (0700, removed on stop) when every vLLM instance runs on its host, and an
instance or router asked to use TCP events beside TLS refuses to start (fail closed).
`idle_spin_s`: how long each vLLM process spins (sched_yield) after a read of its step queue
before it sleeps; vLLM's is 1 s and not configurable (integrations/vllm/launch.py sets it).
`auto` (the default): 0.01 s for an instance pinned to `cores` (there its EngineCore's spin
takes the core its own Worker, or a neighbour, computes on), vLLM's own for an unpinned one;
a number (>= 0.005 s): that, for every instance.
Per worker: `cores` ("0", "0-1": VLLM_CPU_OMP_THREADS_BIND) and `vllm_args` (appended).
A relative `model.dir` is resolved against the topology file's folder.
`device: cuda` (docs/gpu.md): the instances are the CUDA `vllm` build's, each on the GPUs its
worker's `gpus` names (CUDA_VISIBLE_DEVICES; several GPUs: a tensor-parallel instance), with
no CPU pinning and no CPU KV space (`kv_cache_gib` and `cores` are the CPU build's); vLLM sizes
its KV cache from `gpu_memory_utilization`: `auto` gives every instance 0.9 of a GPU divided
by the number of instances that share one of its GPUs on its host, or a number in (0, 1] for
every instance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError

# vLLM's writer notifies readers on a zmq PUB socket with SNDHWM 1, which can drop a
# notification sent soon after the previous one; a reader that sleeps at once then waits out
# its 5 s recheck (seen: spin 0 decoded ~1 step/s, EngineCore and Worker both in zmq poll). A
# reader that spins a little first reads such messages itself: a spin is not shorter than this.
MIN_IDLE_SPIN_S = 0.005


def check_idle_spin(seconds: float | None, name: str = "vllm.idle_spin_s") -> float | None:
    """`seconds` if it is None (vLLM's own spin) or a number >= MIN_IDLE_SPIN_S; otherwise a
    ConfigError naming `name` (nan is refused too). The one rule the topology, VllmSpec and
    the launcher's env var all apply."""
    if seconds is not None and not seconds >= MIN_IDLE_SPIN_S:
        raise ConfigError(name, seconds,
                          f"must be `auto` or a number of seconds >= {MIN_IDLE_SPIN_S}")
    return seconds

ARCHS = ("llama", "qwen3_next")
DEVICES = ("cpu", "cuda")
GPU_MEMORY_SHARE = 0.9  # `gpu_memory_utilization: auto`: what all instances on one GPU take
_KEYS = {"model", "served_name", "max_model_len", "max_num_batched_tokens", "kv_cache_gib",
         "block_size_tokens", "args", "kv_events", "idle_spin_s", "events_dir", "device",
         "gpu_memory_utilization"}


@dataclass(frozen=True, slots=True)
class VllmSettings:
    arch: str = "llama"
    model_dir: str = "out/vllm-models/llama"
    model_seed: int = 0
    served_name: str = "tiny"
    max_model_len: int = 4096
    max_num_batched_tokens: int = 1024
    kv_cache_gib: int = 1
    block_size_tokens: int = 128
    args: tuple[str, ...] = ("--enforce-eager",)
    kv_events: bool = False
    idle_spin_s: float | None = None  # None: auto (module docstring)
    events_dir: str | None = None  # kv_events on unix sockets in this folder; None: TCP
    device: str = "cpu"  # cpu: vllm-cpu; cuda: the CUDA build, on each worker's `gpus`
    gpu_memory_utilization: float | None = None  # None: auto (module docstring)
    # "trained": the shipped weights trained on the stdlib's docstrings; "seed": random from
    # model_seed (integrations/vllm/model_builder.py)
    model_weights: str = "trained"

    def __post_init__(self) -> None:
        check_idle_spin(self.idle_spin_s)
        if self.device not in DEVICES:
            raise ConfigError("vllm.device", self.device, f"must be one of {', '.join(DEVICES)}")
        share = self.gpu_memory_utilization
        if share is not None and not 0.0 < share <= 1.0:
            raise ConfigError("vllm.gpu_memory_utilization", share,
                              "must be `auto` or a fraction in (0, 1]")
        if self.model_weights not in ("trained", "seed"):
            raise ConfigError("vllm.model.weights", self.model_weights, "one of trained, seed")
        if self.arch not in ARCHS:
            raise ConfigError("vllm.model.arch", self.arch, f"unknown; known: {', '.join(ARCHS)}")
        for key in ("max_model_len", "max_num_batched_tokens", "kv_cache_gib",
                    "block_size_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"vllm.{key}", getattr(self, key), "must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return {"model": {"arch": self.arch, "dir": self.model_dir, "seed": self.model_seed,
                          "weights": self.model_weights},
                "served_name": self.served_name, "max_model_len": self.max_model_len,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "kv_cache_gib": self.kv_cache_gib, "block_size_tokens": self.block_size_tokens,
                "args": list(self.args), "kv_events": self.kv_events,
                "idle_spin_s": "auto" if self.idle_spin_s is None else self.idle_spin_s,
                **({"events_dir": self.events_dir} if self.events_dir is not None else {}),
                **({"device": self.device,
                    "gpu_memory_utilization": "auto" if self.gpu_memory_utilization is None
                    else self.gpu_memory_utilization} if self.device != "cpu" else {})}


def parse_vllm(raw: object, base: Path | None) -> VllmSettings | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("vllm", raw, "must be a mapping")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError("vllm", unknown[0], f"unknown key; allowed: {', '.join(sorted(_KEYS))}")
    model = raw.get("model") or {}
    if not isinstance(model, dict) or set(model) - {"arch", "dir", "seed", "weights"}:
        raise ConfigError("vllm.model", model, "must be a mapping of arch, dir, seed, weights")
    arch = str(model.get("arch", "llama"))
    # abspath, not resolve: a symlinked topologies/ folder keeps its place in the tree
    model_dir = os.path.abspath(os.path.join(base or Path.cwd(),
                                             str(model.get("dir", f"out/vllm-models/{arch}"))))
    args = raw.get("args", ["--enforce-eager"])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError("vllm.args", args, "must be a list of strings")
    kv_events = raw.get("kv_events", False)
    if not isinstance(kv_events, bool):
        raise ConfigError("vllm.kv_events", kv_events, "must be true or false")
    spin = raw.get("idle_spin_s", "auto")
    if spin != "auto" and (isinstance(spin, bool) or not isinstance(spin, (int, float))):
        raise ConfigError("vllm.idle_spin_s", spin,
                          f"must be `auto` or a number of seconds >= {MIN_IDLE_SPIN_S}")
    events_dir = raw.get("events_dir")
    if events_dir is not None and (not isinstance(events_dir, str) or not events_dir):
        raise ConfigError("vllm.events_dir", events_dir, "must be a folder's path")
    share = raw.get("gpu_memory_utilization", "auto")
    if share != "auto" and (isinstance(share, bool) or not isinstance(share, (int, float))):
        raise ConfigError("vllm.gpu_memory_utilization", share,
                          "must be `auto` or a fraction in (0, 1]")
    try:
        return VllmSettings(
            arch, model_dir, int(model.get("seed", 0)),
            str(raw.get("served_name", "tiny")), int(raw.get("max_model_len", 4096)),
            int(raw.get("max_num_batched_tokens", 1024)), int(raw.get("kv_cache_gib", 1)),
            int(raw.get("block_size_tokens", 128)), tuple(args), kv_events,
            None if spin == "auto" else float(spin),
            None if events_dir is None else os.path.abspath(os.path.join(base or Path.cwd(),
                                                                         events_dir)),
            str(raw.get("device", "cpu")), None if share == "auto" else float(share),
            str(model.get("weights", "trained")))
    except (TypeError, ValueError) as exc:
        raise ConfigError("vllm", raw, f"bad value: {exc}") from exc
