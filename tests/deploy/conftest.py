"""A real 3-node Ray cluster on this host, shared by the Ray deployment tests.

Nodes: head {router: 1}, one {dc_prfaas: 1}, one {dc_local: 1}; one CPU and an 80 MiB object
store each, every one on 127.0.0.1 (serve/deploy/ray/loopback.py: the deployment's traffic
stays on loopback, never the host's interface address). The test starts and stops every Ray
process itself (`Cluster.shutdown`, never `ray stop`, which would kill other users' Ray
processes on the host), keeps every fixed port above 20000 (Ray's worker ports default to
10002-19999) and sends no usage statistics.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from needs import check


@dataclass(frozen=True)
class RayCluster:
    address: str
    nodes: dict[str, str]  # custom resource -> node id (hex)


# Per module, not per session: a session-scoped cluster (~0.8 GiB, a raylet per node) would
# stay up through the rest of the suite after tests/deploy has finished with it.
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    check("ray")
    from prfaas.serve.deploy.ray.loopback import loopback_cluster

    with loopback_cluster() as cluster:
        yield RayCluster(cluster.address, cluster.nodes)


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    """The tiny model in-process: what `prfaas generate` runs."""
    from prfaas.engine import Engine, EngineConfig

    yield Engine(EngineConfig.tiny(threads=1))
