"""LayerKV <-> numpy arrays, for the torch-free transport.

fp32 CPU tensors map to numpy with `.numpy()` (zero-copy: the array shares the tensor's
memory) and back with `torch.from_numpy` (zero-copy too). Arrays must be float32; any other
dtype is rejected rather than silently converted, since the engine's exactness relies on the
bytes arriving unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from prfaas.core.errors import ConfigError
from prfaas.engine.kv import LayerKV

KINDS = ("mla", "gqa", "swa", "linear")


def layer_kv_to_arrays(layer: LayerKV) -> list[tuple[str, np.ndarray]]:
    """The layer's named tensors as C-contiguous float32 arrays, in name order."""
    out = []
    for name in sorted(layer.tensors):
        tensor = layer.tensors[name].detach()
        if tensor.dtype != torch.float32:
            raise ConfigError(f"layer[{layer.layer_index}].{name}", str(tensor.dtype),
                              "only float32 KV crosses the wire")
        out.append((name, tensor.contiguous().numpy()))
    return out


def layer_kv_from_arrays(layer_index: int, kind: str, start: int, end: int,
                         arrays: list[tuple[str, np.ndarray]]) -> LayerKV:
    """Rebuild a LayerKV from received arrays (shared memory, no copy when they are
    C-contiguous float32; read-only arrays are copied since torch needs writable memory)."""
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
    return LayerKV(layer_index, kind, start, end, tensors)
