"""A real 3-node Ray cluster on this host, shared by the Ray deployment tests.

Nodes: head {router: 1}, one {dc_prfaas: 1}, one {dc_local: 1}; one CPU and an 80 MiB object
store each. The test starts and stops every Ray process itself (`Cluster.shutdown`, never
`ray stop`, which would kill other users' Ray processes on the host), keeps every fixed port
above 20000 (Ray's worker ports default to 10002-19999) and sends no usage statistics.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from needs import check

NODE_BYTES = 80 * 2**20


def _port_above_20000() -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("", 0))
            port: int = s.getsockname()[1]
        if port > 20000:
            return port
    raise RuntimeError("no free port above 20000")


@dataclass(frozen=True)
class RayCluster:
    address: str
    nodes: dict[str, str]  # custom resource -> node id (hex)


# Per module, not per session: a session-scoped cluster (~0.8 GiB, a raylet per node) would
# stay up through the rest of the suite after tests/deploy has finished with it.
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    check("ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["VLLM_NO_USAGE_STATS"] = "1"
    from ray.cluster_utils import Cluster

    common = {"num_cpus": 1, "object_store_memory": NODE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "resources": {"router": 1}, "gcs_server_port": _port_above_20000(),
        "include_dashboard": False, "dashboard_agent_listen_port": _port_above_20000()})
    try:
        nodes = {"router": cluster.head_node.node_id}
        for resource in ("dc_prfaas", "dc_local"):
            nodes[resource] = cluster.add_node(**common, resources={resource: 1}).node_id
        cluster.wait_for_nodes()
        yield RayCluster(cluster.address, nodes)
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    """The tiny model in-process: what `prfaas generate` runs."""
    from prfaas.engine import Engine, EngineConfig

    yield Engine(EngineConfig.tiny(threads=1))
