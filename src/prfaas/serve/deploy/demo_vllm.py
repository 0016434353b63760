"""`make demo-vllm`: the vLLM deployment of a topology, a few requests through the router.

Starts `topologies/vllm-local-llama.yaml` (or the topology given) on free ports: 3 vLLM
instances + the prfaas router; sends a short prompt (PD-P route), a long one (PrfaaS route,
its KV over the shaped link layer by layer) and the long one again (cached tokens); prints
the `prfaas` object of each and the router's /metrics lines about routes; stops everything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import urllib.request
from typing import Any

from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import load_topology


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
        return reply


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--topology", default="topologies/vllm-local-llama.yaml")
    args = ap.parse_args(argv)
    topo = load_topology(args.topology)
    topo = dataclasses.replace(topo, router_port=0, workers=tuple(
        dataclasses.replace(w, port=0, kv_port=0) for w in topo.workers))
    rng = random.Random(0)
    short = [rng.randrange(3, 1000) for _ in range(200)]
    long_ = [rng.randrange(3, 1000) for _ in range(3000)]
    print(f"starting {len(topo.workers)} vLLM instances + router of {topo.name!r} "
          "(a few minutes on 2 cores)...", flush=True)
    with Deployment(topo) as dep:
        for label, prompt in (("short", short), ("long", long_), ("long again", long_)):
            reply = _post(dep.url, {"model": "tiny", "prompt": prompt, "max_tokens": 16,
                                    "temperature": 0})
            p = reply["prfaas"]
            print(f"{label:>10} ({len(prompt)} tokens): route={p['route']} "
                  f"prefill={p['prefill_node']} decode={p['decode_node']} "
                  f"cached={p['cached_tokens']} ttft={p['ttft_s']:.2f}s "
                  f"e2e={p['e2e_s']:.2f}s token_ids={p['token_ids'][:8]}...", flush=True)
        with urllib.request.urlopen(f"{dep.url}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("prfaas_requests_total"):
                    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
