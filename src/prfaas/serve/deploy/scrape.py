"""Prometheus scrape targets of a deployment, as a `file_sd_configs` file.

One group per process: the router (`component: router`) and every worker (`component: worker`,
with its `worker` name and `role`), all with the deployment's `region` (the PD cluster the
router serves: the alert rules and the dashboard aggregate by it). A worker whose control API
is HTTPS (`security.tls`) gets `__scheme__: https`; its scrape job then needs the router's
client certificate (docs/operate.md). deploy/prometheus/prometheus.yml reads every
`deploy/prometheus/targets/*.json`; `targets/local.json` is this module's output for the
embedded `local.yaml` (tests/monitoring checks it is current).

    python -m prfaas.serve.deploy.scrape [--topology FILE] [--region NAME] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prfaas.serve.topology import Topology, load_topology

ANY_ADDRESS = ("0.0.0.0", "::", "")


def scrape_targets(topology: Topology, region: str | None = None) -> list[dict[str, Any]]:
    """The file_sd groups of `topology` (its resolved ports: port 0 is not a target)."""
    region = region or topology.name
    host = "127.0.0.1" if topology.router_host in ANY_ADDRESS else topology.router_host
    groups = [_group(host, topology.router_port, {"component": "router", "region": region})]
    for w in topology.workers:
        labels = {"component": "worker", "worker": w.name, "role": w.role, "region": region}
        if w.tls:
            labels["__scheme__"] = "https"
        groups.append(_group(w.host, w.port, labels))
    return groups


def _group(host: str, port: int, labels: dict[str, str]) -> dict[str, Any]:
    if port == 0:
        raise ValueError(f"{labels}: port 0 is not a scrape target (resolve the ports first)")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {"targets": [address], "labels": labels}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m prfaas.serve.deploy.scrape",
                                 description="Write a deployment's Prometheus file_sd targets.")
    ap.add_argument("--topology", help="topology YAML (default: the embedded local.yaml)")
    ap.add_argument("--region", help="the region label (default: the topology's name)")
    ap.add_argument("--out", help="file to write (default: stdout)")
    args = ap.parse_args(argv)
    text = json.dumps(scrape_targets(load_topology(args.topology), args.region), indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
