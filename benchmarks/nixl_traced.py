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

With PRFAAS_NIXL_PROG_THREAD=0 (the benchmark's stack `nixl_noprog`) the one other change:
the agent is created with `enable_prog_thread=False` (vLLM passes no value, so NIXL's default,
True, starts a thread that polls UCX continuously: docs/vllm.md, "Figures"). vLLM
still checks its transfers every engine step (`check_xfer_state`, `get_new_notifs`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker as _base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlPullConnector,
)

_TRACE = os.environ.get("PRFAAS_NIXL_TRACE")

if os.environ.get("PRFAAS_NIXL_PROG_THREAD") == "0" and _base_worker.nixl_agent_config:
    _agent_config = _base_worker.nixl_agent_config

    def _no_progress_thread(*args: Any, **kwargs: Any) -> Any:
        return _agent_config(*args, **{**kwargs, "enable_prog_thread": False})

    _base_worker.nixl_agent_config = _no_progress_thread


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
