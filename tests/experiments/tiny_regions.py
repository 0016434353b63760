"""A small two-region scenario for the live multi-cluster tests (seconds, not minutes)."""

from pathlib import Path
from typing import Any

import yaml


def tiny_regions() -> dict[str, Any]:
    def region(name: str, gbps: float, mu: float) -> dict[str, Any]:
        return {"name": name, "hardware": "slow", "instances": 2, "link": {"gbps": gbps},
                "workload": {"input": {"dist": "lognormal", "mu": mu, "sigma": 0.6,
                                       "min_tokens": 256, "max_tokens": 8192},
                             "output_tokens": 16, "rate_rps": 1.0}}

    return {
        "name": "tiny-regions",
        "kv": {"fit": "linear", "points": [{"length_tokens": 1000, "bytes": 2.0e6},
                                           {"length_tokens": 10000, "bytes": 1.1e7}]},
        "hardware": {
            "fast": {"gpus_per_instance": 1, "prefill": {"fit": "quadratic", "points": [
                {"length_tokens": 1000, "time_s": 0.2}, {"length_tokens": 4000, "time_s": 0.5},
                {"length_tokens": 16000, "time_s": 2.0}]}},
            "slow": {"gpus_per_instance": 1, "prefill": {"scale_of": "fast", "factor": 3.0},
                     "decode": {"bs_max": 4, "step_s": 0.02}},
        },
        "clusters": {"prfaas": {"hardware": "fast", "instances": 1}},
        "baselines": {"whole_request_routing": {"hardware": "slow", "instances": 2}},
        "pd_clusters": [region("east", 10.0, 8.0), region("west", 5.0, 8.1)],
        "planner": {"t_step_tokens": 100, "mode": "exact"},
    }


def write_regions(folder: Path) -> Path:
    path = folder / "tiny-regions.yaml"
    path.write_text(yaml.safe_dump(tiny_regions()))
    return path
