"""LayerKV <-> numpy arrays, for the torch-free transport.

fp32 CPU tensors map to numpy with `.numpy()` (zero-copy: the array shares the tensor's
memory) and back with `torch.from_numpy` (zero-copy too). What crosses is float32: a bf16 or
fp16 tensor (a GPU engine's KV) widens to it exactly, any other dtype is rejected rather than
silently converted, since the engine's exactness relies on the values arriving unchanged. A
tensor on a GPU is copied to the host here, on the calling thread, synchronously: correct, but
the slow path on a GPU (the layer shipper moves KV off the device without stalling the model).
Received arrays come back as host float32 tensors, or on `device` in `dtype` when given
(Engine.import_kv places them itself).
"""

from __future__ import annotations

import numpy as np
import torch

from prfaas.core.errors import ConfigError
from prfaas.engine.kv import LayerKV

KINDS = ("mla", "gqa", "swa", "linear")
WIDENS = (torch.float32, torch.bfloat16, torch.float16)  # exactly representable in float32


def layer_kv_to_arrays(layer: LayerKV) -> list[tuple[str, np.ndarray]]:
    """The layer's named tensors as C-contiguous float32 arrays, in name order."""
    out = []
    for name in sorted(layer.tensors):
        tensor = layer.tensors[name].detach()
        if tensor.dtype not in WIDENS:
            raise ConfigError(f"layer[{layer.layer_index}].{name}", str(tensor.dtype),
                              "only float32 KV crosses the wire (bf16 / fp16 widen to it)")
        out.append((name, tensor.cpu().float().contiguous().numpy()))
    return out


def layer_kv_from_arrays(layer_index: int, kind: str, start: int, end: int,
                         arrays: list[tuple[str, np.ndarray]],
                         device: torch.device | str | None = None,
                         dtype: torch.dtype | None = None) -> LayerKV:
    """Rebuild a LayerKV from received arrays (shared memory, no copy when they are
    C-contiguous float32; read-only arrays are copied since torch needs writable memory);
    with `device` / `dtype`, moved there."""
    if kind not in KINDS:
        raise ConfigError("kind", kind, f"unknown layer kind; known: {', '.join(KINDS)}")
    if not 0 <= start <= end:
        raise ConfigError("token_range", (start, end), "need 0 <= start <= end")
    tensors: dict[str, torch.Tensor] = {}
    for name, array in arrays:
        if array.dtype != np.float32:
            raise ConfigError(f"layer[{layer_index}].{name}", str(array.dtype),
                              "expected float32")
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, dtype=np.float32, order="C", copy=True)
        tensors[name] = torch.from_numpy(array)
        if device is not None or dtype is not None:
            tensors[name] = tensors[name].to(device=device, dtype=dtype)
    return LayerKV(layer_index, kind, start, end, tensors)
