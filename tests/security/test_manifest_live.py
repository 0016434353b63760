"""The integrity manifest, through a LIVE decode worker: a genuine transfer is answered with
the exact tokens; a missing linear-state layer, a stale END from a previous request, KV from a
different model, a truncated tensor, a reordered tensor and a replayed transfer are each
refused with an IntegrityError line naming the problem, and none is answered with a token.

The test plays the prefill worker: it opens the decoder's /generate stream (whose `ready` line
carries the attempt's nonce), computes the real KV of the prompt with the tiny model, tampers
with it, and ships it to the decoder's KV port with the real KVSender and ManifestBuilder."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from security_helpers import Shipment, request, shipment, topology

from prfaas.engine import Engine
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.native import engine_config
from prfaas.serve.worker.manifest import Binding, ManifestBuilder, model_identity
from prfaas.transport import KVSender, SenderConfig

_ids = itertools.count(1000)
# (what is sent, what the manifest binds, and "honest" (the manifest describes what is sent,
# e.g. a buggy sender) or None (the manifest describes the genuine KV: changed on the way)
Tampered = tuple[Shipment, Binding, bool | None]


@pytest.fixture(scope="module")
def decoder() -> Iterator[Deployment]:
    # only the decode worker (and the router) run: this test is the prefill side
    with Deployment(topology(), external=frozenset({"prfaas-0", "pdp-0"})) as dep:
        yield dep


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(engine_config(topology().model))


class Stream:
    """The decoder's NDJSON /generate stream for one request."""

    def __init__(self, dep: Deployment, rid: int, token_ids: list[int], max_tokens: int):
        w = dep.topology.worker("pdd-0")
        self.conn = http.client.HTTPConnection(w.host, w.port, timeout=60)
        body = {"request_id": rid, "token_ids": token_ids, "max_tokens": max_tokens,
                "sampling": {"temperature": 0.0}}
        self.conn.request("POST", "/generate", json.dumps(body),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.ready = self.next()
        assert self.ready["event"] == "ready", self.ready

    def next(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.resp.readline())
        return event

    def rest(self) -> list[dict[str, Any]]:
        events = []
        while line := self.resp.readline():
            events.append(json.loads(line))
        self.conn.close()
        return events


async def _ship(dep: Deployment, rid: int, items: Shipment, binding: Binding,
                edit: Callable[[bytes], bytes] = lambda m: m,
                manifest_of: Shipment | None = None) -> bytes:
    """Send `items`; the manifest digests `manifest_of` (default: what is sent)."""
    w = dep.topology.worker("pdd-0")
    builder = ManifestBuilder(binding)
    for layer, _kind, name, array in items if manifest_of is None else manifest_of:
        builder.add(layer, name, array)
    async with KVSender(w.host, w.kv_port, SenderConfig(num_connections=2)) as tx:
        for layer, kind, name, array in items:
            await tx.send_array(rid, layer, kind, name, array)
        manifest = edit(await builder.encode())
        await tx.finish(rid, manifest=manifest)
    return manifest


def _attempt(dep: Deployment, engine: Engine, prompt: str,
             tamper: Callable[[Shipment, Binding], Tampered] | None = None,
             edit: Callable[[bytes], bytes] = lambda m: m, max_tokens: int = 4,
             ) -> tuple[list[dict[str, Any]], Shipment, Binding, int]:
    ids = engine.tokenizer.encode(prompt)
    rid = next(_ids)
    stream = Stream(dep, rid, ids, max_tokens)
    ship_from = int(stream.ready["cached_tokens"])
    binding = Binding(rid, stream.ready["nonce"], model_identity(engine),
                      engine.config.layer_pattern, ship_from, tuple(ids))
    items = genuine = shipment(engine, ids, ship_from)
    if tamper is not None:
        items, binding, honest = tamper(items, binding)
        genuine = genuine if honest is None else items  # None: manifest of the genuine KV
    asyncio.run(_ship(dep, rid, items, binding, edit, genuine))
    return stream.rest(), items, binding, rid


def _integrity_failures(dep: Deployment) -> int:
    _, status = request(f"{dep.topology.worker('pdd-0').url}/status")
    return int(status["integrity_failures"])


def _refused(events: list[dict[str, Any]], match: str) -> str:
    assert not [e for e in events if e["event"] == "token"], events  # no token left
    assert len(events) == 1 and events[0]["event"] == "error", events
    assert events[0]["type"] == "IntegrityError", events
    assert match in events[0]["message"], events[0]["message"]
    return str(events[0]["message"])


def test_genuine_transfer_is_admitted_with_exact_tokens(decoder: Deployment,
                                                        engine: Engine) -> None:
    prompt = "a genuine transfer, verified before admission"
    events, *_ = _attempt(decoder, engine, prompt)
    tokens = [e["id"] for e in events if e["event"] == "token"]
    assert tokens == engine.generate(engine.tokenizer.encode(prompt), 4), events
    assert events[-1]["event"] == "done" and events[-1]["kv_verify_s"] >= 0


def _drop_linear_layer(items: Shipment, b: Binding) -> Tampered:
    first_linear = next(i for i, k in enumerate(b.layer_pattern) if k == "K")
    return [t for t in items if t[0] != first_linear], b, True  # frames AND manifest entry


def _truncate(items: Shipment, b: Binding) -> Tampered:
    out = list(items)
    i = next(j for j, t in enumerate(out) if t[1] == "mla")
    layer, kind, name, a = out[i]
    out[i] = (layer, kind, name, a[:-3])  # three rows short, a self-consistent frame header
    return out, b, None


def _reorder(items: Shipment, b: Binding) -> Tampered:
    out = list(items)
    i = next(j for j, t in enumerate(out) if t[1] == "mla")
    layer, kind, name, a = out[i]
    half = len(a) // 2
    out[i] = (layer, kind, name, np.concatenate([a[half:], a[:half]]))  # same bytes, moved
    return out, b, None


CASES = [
    ("missing_linear_state_layer", _drop_linear_layer, "(linear) missing from the transfer"),
    ("truncated_tensor", _truncate, "truncated or reshaped"),
    ("reordered_tensor", _reorder, "altered, reordered or mixed up"),
]


@pytest.mark.parametrize(("case", "tamper", "match"), CASES, ids=[c[0] for c in CASES])
def test_tampered_transfer_is_refused(decoder: Deployment, engine: Engine, case: str,
                                      tamper: Any, match: str) -> None:
    before = _integrity_failures(decoder)
    events, *_ = _attempt(decoder, engine, f"[{case}] a prompt whose KV is tampered with",
                          tamper, max_tokens=4)
    _refused(events, match)
    assert _integrity_failures(decoder) == before + 1


def test_kv_from_a_different_model_is_refused(decoder: Deployment, engine: Engine) -> None:
    other = Engine(dataclasses.replace(engine.config, seed=1))  # same shapes, other weights

    def from_other(items: Shipment, b: Binding) -> Tampered:
        ids = list(b.token_ids)
        return shipment(other, ids, b.ship_from), dataclasses.replace(
            b, model_id=model_identity(other)), True

    events, *_ = _attempt(decoder, engine, "KV computed by another model", from_other)
    _refused(events, "KV from a different model")


def test_stale_end_from_a_previous_request_is_refused(decoder: Deployment,
                                                      engine: Engine) -> None:
    """This request's frames, but the END (manifest) of the request before it."""
    def stale(items: Shipment, b: Binding) -> Tampered:
        return items, dataclasses.replace(b, request_id=b.request_id - 1), True

    events, *_ = _attempt(decoder, engine, "a stale END frame", stale)
    _refused(events, "a stale transfer of another request")


def test_replayed_transfer_is_refused(decoder: Deployment, engine: Engine) -> None:
    """An eavesdropper on the KV link replays a genuine, already admitted transfer for a new
    request of the same prompt, rewriting the request id; it cannot know the new nonce."""
    prompt = "a transfer recorded on the link and replayed later"
    events, items, binding, _rid = _attempt(decoder, engine, prompt)
    assert events[-1]["event"] == "done"
    ids = engine.tokenizer.encode(prompt)
    rid = next(_ids)
    stream = Stream(decoder, rid, ids, 4)
    assert stream.ready["nonce"] != binding.nonce

    def new_id(manifest: bytes) -> bytes:
        m = json.loads(manifest)
        m["request_id"] = rid
        return json.dumps(m, sort_keys=True, separators=(",", ":")).encode()

    asyncio.run(_ship(decoder, rid, items, binding, new_id))
    _refused(stream.rest(), "a replayed transfer")
