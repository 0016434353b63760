"""Which GPU each worker of a topology runs on, and the start-time check that they exist.

A worker's device is its own `device` (native workers), else the topology's: `model.device`
for the native engine, `vllm.device` for vLLM instances; `cpu` when none says. A worker on
`cuda` may name its GPUs with `gpus` ("0", "0,1", [2, 3]): indices of the GPUs the launcher
itself sees (so they honour a CUDA_VISIBLE_DEVICES it was started under), handed to the
worker's process as its CUDA_VISIBLE_DEVICES; inside it, `cuda:N` counts from the first of
them. Every vLLM instance on `cuda` names its `gpus` (vLLM uses all it sees; several make a
tensor-parallel instance); a native worker may leave them out (`cuda:N` of the launcher's).

`check_devices` runs where the deployment starts, before any process: a worker asking for
`cuda` on a host without a CUDA GPU, or for a GPU index past the ones it has, fails the start
in one line naming the worker and the device. Counting GPUs needs torch, which the router's
side never imports: it runs in a short child process, and only when some worker asks for a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prfaas.core.errors import ConfigError, PrfaasError
from prfaas.models.engine_config import check_device, device_index

if TYPE_CHECKING:
    from prfaas.serve.topology import Topology, WorkerSpec

CVD = "CUDA_VISIBLE_DEVICES"
PROBE_TIMEOUT_S = 120.0
_PROBE = ("import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")


class DeviceError(PrfaasError):
    """A worker asks for a GPU this host does not have (one line: the worker, the device)."""


def parse_gpus(raw: object, where: str) -> tuple[int, ...]:
    """`0`, `"0,1"`, `[0, 1]` -> (0, 1); None -> (); anything else a ConfigError."""
    if raw is None:
        return ()
    items: Iterable[object]
    if isinstance(raw, bool):
        raise ConfigError(where, raw, "must be GPU indices: 0, \"0,1\" or [0, 1]")
    if isinstance(raw, int):
        items = [raw]
    elif isinstance(raw, str):
        items = [p.strip() for p in raw.split(",") if p.strip()]
    elif isinstance(raw, list):
        items = raw
    else:
        raise ConfigError(where, raw, "must be GPU indices: 0, \"0,1\" or [0, 1]")
    out: list[int] = []
    for item in items:
        text = str(item)
        if isinstance(item, bool) or not text.isdigit():
            raise ConfigError(where, raw, "must be GPU indices: 0, \"0,1\" or [0, 1]")
        out.append(int(text))
    if not out:
        raise ConfigError(where, raw, "names no GPU")
    if len(set(out)) != len(out):
        raise ConfigError(where, raw, "names a GPU twice")
    return tuple(out)


def check_worker_gpus(name: str, device: str, gpus: tuple[int, ...], engine: str) -> None:
    """A worker's device and GPUs agree (no host knowledge): GPUs only on cuda, a vLLM
    instance on cuda names its GPUs, `cuda:N` with GPUs names one of them."""
    check_device(device, f"workers.{name}.device")
    index = device_index(device)
    if gpus and index is None:
        raise ConfigError(f"workers.{name}.gpus", list(gpus),
                          "given, but the worker runs on the cpu (set its device to cuda)")
    if engine == "vllm" and index is not None and not gpus:
        raise ConfigError(f"workers.{name}.gpus", None,
                          "a vLLM instance on cuda needs its GPUs (gpus: 0, or \"0,1\" for a "
                          "tensor-parallel instance)")
    if engine == "vllm" and device not in ("cpu", "cuda"):
        raise ConfigError(f"workers.{name}.device", device,
                          "a vLLM instance uses the GPUs in its `gpus`: write cuda")
    if gpus and index is not None and index >= len(gpus):
        raise ConfigError(f"workers.{name}.device", device,
                          f"its gpus {list(gpus)} make cuda:0..cuda:{len(gpus) - 1}")


def visible_devices(gpus: tuple[int, ...], environ: Mapping[str, str]) -> str:
    """The CUDA_VISIBLE_DEVICES of a worker with `gpus`, given the launcher's environment:
    indices into the launcher's own CUDA_VISIBLE_DEVICES when it has one."""
    parent = environ.get(CVD)
    if parent is None:
        return ",".join(str(g) for g in gpus)
    seen = [p.strip() for p in parent.split(",") if p.strip()]
    return ",".join(seen[g] if g < len(seen) else str(g) for g in gpus)


def gpu_env(gpus: tuple[int, ...], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker's process gets for its GPUs (none without `gpus`)."""
    return {CVD: visible_devices(gpus, environ)} if gpus else {}


def count_gpus(environ: Mapping[str, str] | None = None) -> int:
    """CUDA GPUs a process started with `environ` sees (0: none, or no CUDA torch)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S,
                              env=dict(os.environ if environ is None else environ))
    except (OSError, subprocess.TimeoutExpired):
        return 0
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


def wanted_gpus(device: str, gpus: tuple[int, ...]) -> tuple[int, ...]:
    """The launcher-side GPU indices a worker uses: its `gpus`, else the one `cuda:N` names."""
    index = device_index(device)
    if index is None:
        return ()
    return gpus or (index,)


def check_devices(topology: Topology, workers: Iterable[WorkerSpec],
                  count: Callable[[], int] | None = None) -> None:
    """Every one of `workers` (those this host starts) on a GPU this host has, else a
    DeviceError in one line naming the worker and its device. `count`: how many GPUs there
    are (default: count_gpus, run once and only if some worker asks for a GPU)."""
    needs = [(w, topology.device_of(w), wanted_gpus(topology.device_of(w), w.gpus))
             for w in workers]
    needs = [(w, d, g) for w, d, g in needs if g]
    if not needs:
        return
    have = (count or count_gpus)()
    for worker, device, gpus in needs:
        shown = f"{device} (gpus {','.join(map(str, worker.gpus))})" if worker.gpus else device
        if have == 0:
            raise DeviceError(f"worker {worker.name}: device {shown}, but this host has no "
                              f"CUDA GPU (torch.cuda.device_count() is 0)")
        if max(gpus) >= have:
            raise DeviceError(f"worker {worker.name}: device {shown} needs GPU {max(gpus)}, "
                              f"but this host has {have} (0..{have - 1})")
