"""Helpers of the live security tests: a small topology on free ports, HTTP(S) calls, and the
KV a real prefill of the tiny model ships (built with the prefill worker's own functions)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.engine import Engine, LayerKV
from prfaas.serve.topology import Topology, parse_topology
from prfaas.serve.worker.kvship import layer_arrays, meta_arrays, reframe

KEY = "sk-test-0123456789abcdef"


@dataclass(frozen=True)
class Certs:
    dir: Path  # ca.pem + NAME.pem/NAME.key of the topology members
    foreign: Path  # ca.pem + a certificate named prfaas-0 from another CA

Shipment = list[tuple[int, str, str, np.ndarray]]  # (layer, kind, name, array)


def topology(**overrides: Any) -> Topology:
    raw: dict[str, Any] = {
        "name": "security-test",
        "model": {"preset": "tiny", "threads": 1},
        "policy": {"name": "prfaas-threshold", "threshold_tokens": 256},
        "router": {"port": 0},
        "link": {"rate_gbps": 0.5, "connections": 2},
        "intra_link": {"rate_gbps": None, "connections": 1},
        "timeouts": {"connect_s": 3, "prefill_s": 60, "kv_s": 30, "token_s": 60},
        "workers": [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
                    {"name": "pdd-0", "role": "pd-d", "max_batch": 8}],
    }
    raw.update(overrides)
    return parse_topology(raw)


def request(url: str, body: object | None = None, key: str | None = None,
            context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120, context=context) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def shipment(engine: Engine, token_ids: list[int], ship_from: int = 0) -> Shipment:
    """What the prefill worker sends for this prompt: every layer, snapshots, logits."""
    layers: list[LayerKV] = []
    result = engine.prefill(token_ids, None, lambda layer: layers.append(
        reframe(layer, ship_from, None)))
    out: Shipment = [(layer.layer_index, layer.kind, name, np.array(a))
                     for layer in layers for name, a in layer_arrays(layer)]
    out += meta_arrays(result.kv, result.logits, ship_from, len(token_ids),
                       engine.config.block_size_tokens)
    return out
