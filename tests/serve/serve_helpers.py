"""Helpers of the live serving tests: a small topology on free ports, HTTP calls."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prfaas.serve.topology import Topology, parse_topology

MODEL = "prfaas-tiny-kda"
THRESHOLD_TOKENS = 256  # smaller than local.yaml's 1024 so "long" prompts stay cheap on CPU


def topology(**overrides: Any) -> Topology:
    raw: dict[str, Any] = {
        "name": "test",
        "model": {"preset": "tiny", "threads": 1},
        "policy": {"name": "prfaas-threshold", "threshold_tokens": THRESHOLD_TOKENS},
        "router": {"port": 0},
        # zstd on the inter-DC link: the live tests' PrfaaS route ships compressed frames (the
        # other deployments' links are uncompressed), and tokens must equal Engine.generate's
        "link": {"rate_gbps": 0.5, "connections": 2, "compression": "zstd"},
        "intra_link": {"rate_gbps": None, "connections": 1},
        "timeouts": {"connect_s": 3, "prefill_s": 30, "kv_s": 30, "token_s": 30},
        "cache": {"capacity_mb": 128},
        "workers": [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
                    {"name": "pdd-0", "role": "pd-d", "max_batch": 16}],
    }
    raw.update(overrides)
    return parse_topology(raw)


def post(url: str, body: object, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        text: str = resp.read().decode()
        return text


def complete(url: str, prompt: str | list[int], max_tokens: int = 6, **extra: Any
             ) -> dict[str, Any]:
    status, reply = post(f"{url}/v1/completions", {"model": MODEL, "prompt": prompt,
                                                   "max_tokens": max_tokens, "temperature": 0,
                                                   **extra})
    assert status == 200, reply
    return reply
