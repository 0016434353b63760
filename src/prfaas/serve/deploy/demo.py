"""A short live run for `make demo`: `python -m prfaas.serve.deploy.demo`.

Starts the embedded local topology on free ports, sends short and long prompts (one long
prompt twice, to show the prefix cache), prints each request's route, nodes, cached tokens,
KV bytes shipped and TTFT, then the route counts and egress from /metrics, and stops.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prfaas.security.certs import ROUTER, Member, init_certs
from prfaas.security.spec import SecuritySpec
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import Topology, load_topology


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        reply: dict[str, Any] = json.load(resp)
        return reply


def _prompts() -> list[tuple[str, str]]:
    story = "The prefill cluster streams KVCache layer by layer across datacenters. " * 30
    return [("short", "What is Prefill-as-a-Service?"),
            ("long", story[:1800]),
            ("short", "Hello from the local PD cluster."),
            ("long again", story[:1800]),
            ("long+suffix", story[:1800] + " And then a follow-up question about egress?")]


def run(model_name: str | None = None, tls: bool = False) -> int:
    """`tls`: mutual TLS on the PrfaaS links (certificates in a temp dir, removed after), and
    every answer checked token for token against the engine run in this process."""
    topo = load_topology()
    topo = replace(topo, router_port=0, workers=tuple(replace(w, port=0, kv_port=0)
                                                       for w in topo.workers))
    with contextlib.ExitStack() as stack:
        check = None
        if tls:
            certs = stack.enter_context(tempfile.TemporaryDirectory(prefix="prfaas-demo-tls-"))
            init_certs([*(Member(w.name, w.host) for w in topo.workers), Member(ROUTER)], certs)
            topo = topo.with_security(SecuritySpec(tls_dir=certs))
            check = _exact_checker(topo)
        return _run(topo, model_name, check)


def _exact_checker(topo: Topology) -> Callable[[str, list[int]], bool]:
    from prfaas.engine import Engine
    from prfaas.serve.native import engine_config  # the demo's topology is the native one

    engine = Engine(engine_config(topo.model))
    return lambda prompt, ids: engine.generate(engine.tokenizer.encode(prompt), 8) == ids


def _run(topo: Topology, model_name: str | None,
         check: Callable[[str, list[int]], bool] | None) -> int:
    t0 = time.perf_counter()
    exact: list[bool] = []
    with Deployment(topo) as dep:
        if topo.security.tls:
            print(f"mutual TLS 1.3 on: KV to the decode workers, HTTPS to "
                  f"{[w.url for w in dep.topology.workers if w.tls]}")
        print(f"local topology up in {time.perf_counter() - t0:.1f} s; router {dep.url}; "
              f"threshold {topo.policy_args.get('threshold_tokens')} tokens, "
              f"link {topo.link.rate_gbps} Gbps x {topo.link.connections}")
        model = model_name or _post_models(dep.url)
        print(f"{'prompt':<12} {'tokens':>6} {'route':<7} {'prefill':<9} {'decode':<7} "
              f"{'cached':>6} {'kv_bytes':>9} {'prefill_s':>9} {'ttft_s':>7}")
        for label, prompt in _prompts():
            reply = _post(f"{dep.url}/v1/completions", {"model": model, "prompt": prompt,
                                                        "max_tokens": 8, "temperature": 0})
            p = reply["prfaas"]
            if check is not None:
                exact.append(check(prompt, p["token_ids"]))
            print(f"{label:<12} {reply['usage']['prompt_tokens']:>6} {p['route']:<7} "
                  f"{p['prefill_node']:<9} {p['decode_node']:<7} {p['cached_tokens']:>6} "
                  f"{p['kv_bytes']:>9} {p['prefill_s']:>9.3f} {p['ttft_s']:>7.3f}"
                  + ("" if check is None else f"  exact={exact[-1]}"))
        with urllib.request.urlopen(f"{dep.url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        for row in metrics.splitlines():
            if row.startswith(("prfaas_requests_total", "prfaas_kv_bytes_total",
                               "prfaas_threshold_tokens", "prfaas_ttft_seconds_sum")):
                print("  " + row)
    print(f"stopped; demo took {time.perf_counter() - t0:.1f} s")
    if check is not None:
        print(f"tokens identical to the in-process engine: {sum(exact)}/{len(exact)}")
    return 0 if all(exact) else 1


def _post_models(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        name: str = json.load(resp)["data"][0]["id"]
        return name


if __name__ == "__main__":
    sys.exit(run(tls="--tls" in sys.argv[1:]))
