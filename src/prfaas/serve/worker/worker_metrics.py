"""A worker's /metrics (Prometheus text): the peers its TLS listeners refused, by listener;
a decode worker's integrity failures; a prefill worker's layer shipper (engine/shipper.py)."""

from __future__ import annotations

from aiohttp import web

from prfaas.serve.prom import Counter

SHIPPER_HELP = {
    "tickets": "KV tensors moved off the engine's device for the link.",
    "bytes": "Bytes of KV tensors moved off the engine's device.",
    "staged_bytes": "Of those, bytes copied into the pinned host ring while the model ran.",
    "ring_full_requests": "Requests whose KV went after the forward: the host ring was full.",
    "deferred_tickets": "KV tensors copied to the host by the sender after staging on the "
                        "device (ring full, or a pageable ring).",
    "pinned_fallbacks": "1 when the pinned host ring could not be allocated (pageable instead).",
    "failed_tickets": "KV tensors whose device copy failed (their request failed).",
}


def worker_metrics(refused: dict[str, int], integrity_failures: int | None = None,
                   shipper: dict[str, int] | None = None) -> web.Response:
    tls = Counter("prfaas_tls_refused_total",
                  "Peers refused at the TLS handshake (no or foreign certificate, not TLS, "
                  "or a certificate name that may not call this listener).")
    for listener, n in refused.items():
        tls.set(float(n), listener=listener)
    lines = tls.render()
    if integrity_failures is not None:
        bad = Counter("prfaas_kv_integrity_failures_total",
                      "Transfers whose manifest did not verify (request refused, retried).")
        bad.set(float(integrity_failures))
        lines += bad.render()
    for key, value in (shipper or {}).items():
        metric = Counter(f"prfaas_kv_ship_{key}_total", SHIPPER_HELP[key])
        metric.set(float(value))
        lines += metric.render()
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain",
                        charset="utf-8")
