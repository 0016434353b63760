"""vLLM's NixlConnector with two timestamps added, for benchmarks/bench_vllm.py.

Loaded by vLLM through `kv_connector_module_path` (the benchmark puts benchmarks/ on the
instances' PYTHONPATH). The class keeps vLLM's name `NixlConnector`, so every name-based check
in vLLM (conv-state layout, config validation) treats it as the built-in connector; it is
vLLM's `NixlPullConnector` (what `NixlConnector` aliases) with nothing changed but two hooks
that append a JSON line to $PRFAAS_NIXL_TRACE in the Worker process:
  - `recv_start`: `start_load_kv` was handed requests to pull (the reads are posted next);
  - `recv_done`:  `get_transfer_results` reports a request's pull finished (its KV is in the
    decoder's cache), or `recv_failed`.
Times are time.monotonic() (CLOCK_MONOTONIC, one clock for every process on the host), the
clock the PrfaasConnector's traces use. Cost: one file append per event, a few microseconds.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlPullConnector,
)

_TRACE = os.environ.get("PRFAAS_NIXL_TRACE")


def _trace(ev: str, req: str) -> None:
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(json.dumps({"ev": ev, "req": req, "t": time.monotonic()}) + "\n")


class NixlConnector(NixlPullConnector):
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        for req in getattr(meta, "reqs_to_recv", {}) or {}:
            _trace("recv_start", str(req))
        super().start_load_kv(forward_context, **kwargs)

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        results = super().get_transfer_results(finished_req_ids)
        failed = set(results.failed_recving)
        for req in results.finished_recving:
            _trace("recv_failed" if req in failed else "recv_done", str(req))
        return results
