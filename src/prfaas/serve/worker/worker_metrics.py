"""A worker's /metrics (Prometheus text): the peers its TLS listeners refused, by listener."""

from __future__ import annotations

from aiohttp import web

from prfaas.serve.prom import Counter


def worker_metrics(refused: dict[str, int], integrity_failures: int | None = None
                   ) -> web.Response:
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
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain",
                        charset="utf-8")
