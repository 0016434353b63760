"""A small two-region scenario for the live multi-cluster tests (seconds, not minutes): the
emulated tests' tiny scenario (its KV and hardware), with two PD clusters in place of one."""

from pathlib import Path
from typing import Any

import yaml
from tiny_scenario import tiny_scenario


def tiny_regions() -> dict[str, Any]:
    def region(name: str, gbps: float, mu: float) -> dict[str, Any]:
        return {"name": name, "hardware": "slow", "instances": 2, "link": {"gbps": gbps},
                "workload": {"input": {"dist": "lognormal", "mu": mu, "sigma": 0.6,
                                       "min_tokens": 256, "max_tokens": 8192},
                             "output_tokens": 16, "rate_rps": 1.0}}

    base = tiny_scenario()
    return {
        "name": "tiny-regions", "kv": base["kv"], "hardware": base["hardware"],
        "clusters": {"prfaas": base["clusters"]["prfaas"]},
        "baselines": {"whole_request_routing": {"hardware": "slow", "instances": 2}},
        "pd_clusters": [region("east", 10.0, 8.0), region("west", 5.0, 8.1)],
        "planner": base["planner"],
    }


def write_regions(folder: Path) -> Path:
    path = folder / "tiny-regions.yaml"
    path.write_text(yaml.safe_dump(tiny_regions()))
    return path
