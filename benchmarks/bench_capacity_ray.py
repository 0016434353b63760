"""Wall time of `prfaas capacity --json` locally and with `--ray` on a 3-node Ray cluster that
this script starts on this host (one CPU each; never `ray stop`; no usage statistics), and
whether the JSON is equal. Writes benchmarks/results/capacity_ray.json.

    PYTHONPATH=src python benchmarks/bench_capacity_ray.py [--requests 4000] [capacity flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prfaas.serve.ports import free_port

OUT = Path(__file__).resolve().parent / "results" / "capacity_ray.json"


def main(argv: list[str]) -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    args = argv or ["--requests", "4000"]
    common = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "resources": {"router": 1}, "gcs_server_port": free_port(),
        "include_dashboard": False, "dashboard_agent_listen_port": free_port()})
    runs: dict[str, dict[str, object]] = {}
    try:
        for resource in ("dc_prfaas", "dc_local"):
            cluster.add_node(**common, resources={resource: 1})
        cluster.wait_for_nodes()
        for label, extra in (("local", []), ("ray", ["--ray", cluster.address])):
            cmd = [sys.executable, "-m", "prfaas", "capacity", "--json", *args, *extra]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[label] = {"wall_s": round(time.perf_counter() - t0, 2),
                           "result": json.loads(done.stdout)}
            print(label, runs[label]["wall_s"], "s", flush=True)
    finally:
        cluster.shutdown()
    report = {"args": args, "cluster": "3 nodes x 1 CPU on this host",
              "local_wall_s": runs["local"]["wall_s"], "ray_wall_s": runs["ray"]["wall_s"],
              "equal": runs["local"]["result"] == runs["ray"]["result"],
              "probes": len(runs["local"]["result"]["probes"]),  # type: ignore[index]
              "max_rps": runs["local"]["result"]["max_rps"]}  # type: ignore[index]
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _, capacity_flags = parser.parse_known_args()  # the rest goes to `prfaas capacity`
    main(capacity_flags)
