"""Egress projections (Eq. 2): B_out ≈ (N / P) * Phi_kv(L_avg).

`measured` uses the paper's Table 3 (KV throughput per 8xH200 instance, SGLang), interpolated
log-linearly in length between its points (1K, 8K, 32K, 128K) and clamped outside them;
`model` uses the model's geometry and a prefill profile (Eq. 1, Phi = S_kv / T_prefill).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.models.catalog import catalog
from prfaas.models.profile import HardwareProfile


@cache
def table3() -> dict[str, tuple[list[int], list[float]]]:
    """Model name (as the paper gives it) -> (lengths, Gbps per 8xH200 instance)."""
    raw = json.loads(resources.files("prfaas.data").joinpath("paper_case_study.json").read_text())
    t3 = raw["table3_kv_throughput_gbps"]
    lengths = [int(x) for x in t3["lengths_tokens"]]
    return {k: (lengths, [float(v) for v in vals]) for k, vals in t3.items()
            if k != "lengths_tokens"}


def measured_name(model: str) -> str | None:
    """The Table 3 name for `model` (exact, or via the catalog's aliases), or None."""
    wanted = model.strip().lower()
    names = {n.lower(): n for n in table3()}
    if wanted in names:
        return names[wanted]
    for spec in catalog().values():
        keys = [spec.name.lower(), *(a.lower() for a in spec.aliases)]
        if wanted in keys:
            for key in keys:
                if key in names:
                    return names[key]
    return None


def measured_gbps(model: str, length_tokens: float) -> float:
    name = measured_name(model)
    if name is None:
        raise UnknownNameError("model", model, list(table3()))
    lengths, gbps = table3()[name]
    return float(np.interp(np.log2(length_tokens), np.log2(lengths), gbps))


@dataclass(frozen=True, slots=True)
class EgressProjection:
    model: str
    gpus: int
    gpus_per_instance: int
    length_tokens: int
    per_instance_gbps: float
    egress_gbps: float
    source: str


def project(model: str, gpus: int, gpus_per_instance: int, length_tokens: int, source: str,
            profile: HardwareProfile | None = None) -> EgressProjection:
    if gpus <= 0:
        raise ConfigError("gpus", gpus, "must be positive")
    if gpus_per_instance <= 0 or gpus_per_instance > gpus:
        raise ConfigError("gpus_per_instance", gpus_per_instance, f"must be in [1, {gpus}]")
    if source == "measured":
        phi = measured_gbps(model, length_tokens)
        how = "paper Table 3 (8xH200, SGLang), log-length interpolation"
    elif source == "model":
        if profile is None:
            raise ConfigError("source", source, "needs a prefill profile")
        phi = profile.kv_throughput_gbps(length_tokens)
        how = f"geometry + {profile.prefill.source if profile.prefill else '?'}"
    else:
        raise ConfigError("source", source, "must be measured or model")
    instances = gpus / gpus_per_instance
    return EgressProjection(model, gpus, gpus_per_instance, length_tokens, phi,
                            instances * phi, how)
