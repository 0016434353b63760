"""A worker's /metrics (Prometheus text): the peers its TLS listeners refused, by listener;
its failed KV transfers and manifests; the requests it holds (a prefill worker: waiting for
its engine and computing; a decode worker: decoding, waiting for a batch slot, waiting for KV);
a prefill worker's KV bytes sent and TCP retransmissions on its link, and its layer shipper
(engine/shipper.py)."""

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
                   gauges: dict[str, float] | None = None,
                   counters: dict[str, float] | None = None,
                   shipper: dict[str, int] | None = None) -> web.Response:
    """`gauges` / `counters`: more figures, by their names in `HELP` (the scrape config's
    target labels say which worker and role they are); `shipper`: the layer shipper's counts."""
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
    for values, kind in ((gauges or {}, "gauge"), (counters or {}, "counter")):
        for name, value in values.items():
            metric = Counter(name, HELP[name], kind)
            metric.set(float(value))
            lines += metric.render()
    for key, value in (shipper or {}).items():
        metric = Counter(f"prfaas_kv_ship_{key}_total", SHIPPER_HELP[key])
        metric.set(float(value))
        lines += metric.render()
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain",
                        charset="utf-8")


HELP = {
    "prfaas_worker_queued_requests": "Requests waiting at this worker (a prefill worker: for its "
                                     "engine; a decode worker: for a batch slot).",
    "prfaas_worker_running_requests": "Requests this worker is computing (prefill) or decoding.",
    "prfaas_worker_kv_waiting_requests": "Requests a decode worker holds until their KV arrived.",
    "prfaas_kv_transfer_failures_total": "KV transfers that failed at this worker (a prefill "
                                         "worker: sending; a decode worker: receiving).",
    "prfaas_kv_sent_bytes_total": "KV bytes this prefill worker put on its link (as sent: "
                                  "compressed where the link compresses).",
    "prfaas_kv_tcp_retransmits_total": "TCP retransmissions on this prefill worker's open KV "
                                       "connections (TCP_INFO).",
}
