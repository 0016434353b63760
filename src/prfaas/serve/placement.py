"""Where a component runs, as its /health reports it: `node_id` when a cluster manager placed it.

A deployment target that places processes on nodes (serve/deploy/ray/) sets PRFAAS_NODE_ID in the
component's environment; the worker and router put it in /health and the router's membership
lists it beside each worker's pid. Without it (one host, the embedded launcher) nothing is added.
"""

from __future__ import annotations

import os

NODE_ID_ENV = "PRFAAS_NODE_ID"


def node_label() -> dict[str, str]:
    """`{"node_id": ...}` when a cluster manager placed this process, else `{}`."""
    node_id = os.environ.get(NODE_ID_ENV)
    return {"node_id": node_id} if node_id else {}
