"""Ray nodes on 127.0.0.1: what tests and benchmarks that start clusters on this host use.

Ray maps `node_ip_address="127.0.0.1"` to the host's primary interface address
(`services.resolve_ip_for_localhost`), so a node started "on loopback" registers, and every
actor on it reports, the host's interface address, and a deployment's traffic goes there. In
Ray's single-host mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, its default on macOS and Windows)
that mapping gives loopback instead. `use_loopback()` turns it on for this process (also when
Ray is already imported) and for every process it starts (GCS, raylets, workers inherit the
environment); then `ray.cluster_utils.Cluster` nodes started with `node_ip_address=LOOPBACK`
all sit on 127.0.0.1 and `ray.util.get_node_ip_address()` in an actor says so. In that mode
`ray start --address` (a worker node joining from the CLI) refuses to run; `ray start --head`
and `Cluster.add_node` work. `loopback_cluster()` starts such a cluster, one node per
datacenter resource.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prfaas.serve.ports import free_port

LOOPBACK = "127.0.0.1"
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
       "VLLM_NO_USAGE_STATS": "1"}


def use_loopback() -> dict[str, str]:
    """Put this process, and what it starts, in Ray's single-host mode; the variables set."""
    os.environ.update(ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # read at import time; services reads the attribute per call
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]
    return dict(ENV)


NODE_BYTES = 80 * 2**20
NODES = ("router", "dc_prfaas", "dc_local")  # one node per custom resource, the first the head


@dataclass(frozen=True)
class LoopbackCluster:
    address: str  # the GCS address, on 127.0.0.1
    nodes: dict[str, str]  # custom resource -> node id (hex)


@contextmanager
def loopback_cluster(resources: tuple[str, ...] = NODES, num_cpus: int = 1
                     ) -> Iterator[LoopbackCluster]:
    """A Ray cluster on this host, one node per resource (`{resource: 1}`, one CPU, an 80 MiB
    object store), every node on 127.0.0.1; stopped by its own object (`Cluster.shutdown`),
    never `ray stop`, which would end every Ray process on the host."""
    use_loopback()
    from ray.cluster_utils import Cluster

    common: dict[str, Any] = {"num_cpus": num_cpus, "object_store_memory": NODE_BYTES,
                              "node_ip_address": LOOPBACK}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "resources": {resources[0]: 1}, "gcs_server_port": free_port(),
        "include_dashboard": False, "dashboard_agent_listen_port": free_port()})
    try:
        assert cluster.head_node is not None
        nodes = {resources[0]: cluster.head_node.node_id}
        for resource in resources[1:]:
            nodes[resource] = cluster.add_node(**common, resources={resource: 1}).node_id
        cluster.wait_for_nodes()
        if not cluster.address.startswith(f"{LOOPBACK}:"):
            raise RuntimeError(f"Ray put the cluster at {cluster.address}, not on loopback")
        yield LoopbackCluster(cluster.address, nodes)
    finally:
        cluster.shutdown()
