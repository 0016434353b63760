"""A small two-hardware scenario for the live emulated tests (seconds, not minutes)."""

from pathlib import Path
from typing import Any

import yaml


def tiny_scenario(decode: bool = True) -> dict[str, Any]:
    slow: dict[str, Any] = {"gpus_per_instance": 1,
                            "prefill": {"scale_of": "fast", "factor": 3.0}}
    if decode:
        slow["decode"] = {"bs_max": 4, "step_s": 0.02}
    return {
        "name": "tiny-emulated",
        "kv": {"fit": "linear", "points": [{"length_tokens": 1000, "bytes": 2.0e6},
                                           {"length_tokens": 10000, "bytes": 1.1e7}]},
        "hardware": {
            "fast": {"gpus_per_instance": 1, "prefill": {"fit": "quadratic", "points": [
                {"length_tokens": 1000, "time_s": 0.2}, {"length_tokens": 4000, "time_s": 0.5},
                {"length_tokens": 16000, "time_s": 2.0}]}},
            "slow": slow,
        },
        "clusters": {"prfaas": {"hardware": "fast", "instances": 1},
                     "pd": {"hardware": "slow", "instances": 2}},
        "link": {"gbps": 10},
        "workload": {"input": {"dist": "lognormal", "mu": 8.0, "sigma": 0.6,
                               "min_tokens": 256, "max_tokens": 8192}, "output_tokens": 16},
        "planner": {"t_step_tokens": 100, "mode": "exact"},
    }


def write_scenario(folder: Path, decode: bool = True) -> Path:
    path = folder / "tiny-emulated.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(decode)))
    return path
