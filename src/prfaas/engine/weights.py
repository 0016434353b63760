"""The shipped trained weights: int8 rows in safetensors, float32 when read back.

The tiny models prfaas ships (native presets, the vLLM test models) were trained on the
standard library's docstrings (benchmarks/train_tiny_models.py). They are stored packed, to
keep the repository small: every array of two or more dims as int8 codes with one float32 scale
per row of its last dim (absmax / 127), `NAME` and `NAME.scale`; vectors (norms, biases, gates)
as float32. The model IS the unpacked values: training ends by packing, and every figure of
the trained models is measured on what `read` returns (the packing's cost is in the training
record).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from prfaas.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

DATA = Path(__file__).resolve().parent.parent / "data" / "weights"
FORMAT = "prfaas-int8-rows-v1"
SCALE = ".scale"


def trained_path(name: str) -> Path:
    """The shipped weights file of model `name` (a native config's name or `vllm-<arch>`)."""
    path = DATA / f"{name}.safetensors"
    if not path.is_file():
        known = sorted(p.stem for p in DATA.glob("*.safetensors"))
        raise ConfigError("weights", "trained", f"no trained weights for {name!r} "
                          f"(shipped: {', '.join(known) or 'none'}); use weights: seed")
    return path


def pack(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float arrays -> int8 rows + float32 scales (matrices), float32 (vectors)."""
    out: dict[str, np.ndarray] = {}
    for name, array in sorted(tensors.items()):
        x = np.asarray(array, dtype=np.float32)
        if x.ndim < 2:
            out[name] = np.ascontiguousarray(x)
            continue
        absmax = np.abs(x).max(axis=-1)
        scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
        out[name] = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
        out[name + SCALE] = scale
    return out


def unpack(stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `pack` wrote -> float32 arrays (int8 codes times their row's scale)."""
    out: dict[str, np.ndarray] = {}
    for name, array in stored.items():
        if name.endswith(SCALE):
            continue
        if array.dtype == np.int8:
            scale = stored.get(name + SCALE)
            if scale is None or scale.shape != array.shape[:-1]:
                raise ConfigError("weights", name, "int8 codes without a per-row scale")
            out[name] = array.astype(np.float32) * scale[..., None]
        else:
            out[name] = array.astype(np.float32)
    return out


def write(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "record": json.dumps(metadata, sort_keys=True)}
    save_file(pack(tensors), str(path), metadata=meta)


def read(path: str | Path) -> dict[str, torch.Tensor]:
    """float32 tensors of a weights file: packed (this module's format) or plain safetensors
    (any float dtype, bf16 included)."""
    import torch
    from safetensors import safe_open

    if not Path(path).is_file():
        raise ConfigError("weights", str(path), "no such file")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        stored = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    if meta.get("format") == FORMAT:
        arrays = unpack({k: v.numpy() for k, v in stored.items()})
        return {k: torch.from_numpy(v) for k, v in arrays.items()}
    return {k: v.float() for k, v in stored.items()}


def record(path: str | Path) -> dict[str, Any]:
    """The training record stored with packed weights ({} for a plain file)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    out: dict[str, Any] = json.loads(meta.get("record", "{}"))
    return out
