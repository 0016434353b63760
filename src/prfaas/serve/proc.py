"""Process entry point of one component: `python -m prfaas.serve.proc --topology PATH --name N`.

`N` is a worker name from the topology, or `router`. The process serves until SIGINT/SIGTERM
(aiohttp's run_app turns both into a graceful shutdown that runs every cleanup hook).
"""

from __future__ import annotations

import argparse
import logging
import sys

from aiohttp import web

from prfaas.core.errors import PrfaasError
from prfaas.serve.topology import load_topology


def build_app(topology_path: str, name: str) -> tuple[web.Application, str, int]:
    # imported here: the engine (torch) loads only in the process that serves
    from prfaas.serve.model import engine_config, make_engine

    topo = load_topology(topology_path)
    config = engine_config(topo.model)
    if name == "router":
        from prfaas.serve.router import RouterService

        return RouterService(topo, config).app(), topo.router_host, topo.router_port
    spec = topo.worker(name)
    engine = make_engine(topo.model, spec.role)
    if spec.role == "pd-d":
        from prfaas.serve.decode_worker import DecodeWorker

        return DecodeWorker(topo, spec, engine).app(), spec.host, spec.port
    from prfaas.serve.prefill_worker import PrefillWorker

    return PrefillWorker(topo, spec, engine).app(), spec.host, spec.port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"[{args.name}] %(levelname)s %(message)s")
    try:
        app, host, port = build_app(args.topology, args.name)
    except PrfaasError as exc:
        print(f"[{args.name}] error: {exc}", file=sys.stderr)
        return 2
    web.run_app(app, host=host, port=port, print=None, access_log=None,
                shutdown_timeout=5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
