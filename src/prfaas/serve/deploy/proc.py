"""Process entry point of one component:
`python -m prfaas.serve.deploy.proc --topology PATH --name N`.

`N` is a worker name from the topology, or `router`. The process serves until SIGINT/SIGTERM
(aiohttp's run_app turns both into a graceful shutdown that runs every cleanup hook). With
`security.tls` it loads its own certificate (a bad one: one line, exit 2), and a PrfaaS worker
serves HTTPS that only the router's certificate opens (serve/worker/tls_server.py). The router reads
its API key from PRFAAS_API_KEY (never from the topology file, which is written to disk), its
per-request log's path from PRFAAS_REQUEST_LOG (router/request_log.py), and runs on
`router.cores` when the topology names them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from prfaas.core.errors import PrfaasError
from prfaas.security.apikey import api_key_from_env
from prfaas.security.certs import ROUTER
from prfaas.security.tls import Identity
from prfaas.serve.cores import pin
from prfaas.serve.engines import engine_backend
from prfaas.serve.topology import load_topology
from prfaas.serve.worker.tls_server import Refusals, serve_tls

REQUEST_LOG_ENV = "PRFAAS_REQUEST_LOG"


@dataclass(frozen=True)
class Served:
    """One component's app and where it listens; `tls` set: HTTPS with client certificates."""

    app: web.Application
    host: str
    port: int
    tls: ssl.SSLContext | None = None
    refusals: Refusals | None = None
    accept_name: Callable[[str | None], bool] | None = None


def build_app(topology_path: str, name: str) -> Served:
    topo = load_topology(topology_path)
    backend = engine_backend(topo)
    tls_dir = topo.security.tls_dir
    ident = Identity.load(tls_dir, name) if tls_dir else None  # bad certificates fail here
    if name == "router":
        from prfaas.serve.router.service import RouterService

        pin(topo.router_cores, "router.cores")  # every thread, and those it starts later

        router = RouterService(topo, tls=ident.client_context() if ident else None,
                               api_key=api_key_from_env(), engine=backend,
                               request_log=os.environ.get(REQUEST_LOG_ENV) or None)
        return Served(router.app(), topo.router_host, topo.router_port)
    spec = topo.worker(name)
    # the engine (torch) loads here, in a worker process only; a backend whose workers are
    # another program (vLLM) replaces this process instead and never returns
    engine = backend.worker_engine(name)
    if spec.role == "pd-d":
        from prfaas.serve.worker.decode_worker import DecodeWorker

        decoder = DecodeWorker(topo, spec, engine, kv_tls=ident.server_context() if ident else None)
        return Served(decoder.app(), spec.host, spec.port)
    from prfaas.serve.worker.prefill_worker import PrefillWorker

    worker = PrefillWorker(topo, spec, engine, kv_tls=ident.client_context() if ident else None)
    if ident is None or not spec.tls:
        return Served(worker.app(), spec.host, spec.port)
    # a PrfaaS worker across the link: its control API answers the router only
    return Served(worker.app(), spec.host, spec.port, ident.server_context(),
                  worker.http_refusals, lambda peer: peer == ROUTER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"[{args.name}] %(levelname)s %(message)s")
    try:
        served = build_app(args.topology, args.name)
    except PrfaasError as exc:
        print(f"[{args.name}] error: {exc}", file=sys.stderr)
        return 2
    if served.tls is not None:
        assert served.refusals is not None
        asyncio.run(serve_tls(served.app, served.host, served.port, served.tls,
                              served.refusals, served.accept_name))
        return 0
    web.run_app(served.app, host=served.host, port=served.port, print=None, access_log=None,
                shutdown_timeout=5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
