"""The integrity manifest: what binds a transfer's KV to its request, prompt, model and attempt.

The prefill worker digests every tensor it ships (full-attention KV, linear states, snapshots,
the logits) with SHA-256 as it queues it, off the event loop, and sends the manifest in the
transfer's END (canonical JSON, `ReceivedKV.manifest` on the other side):

    {"v": 1, "request_id": R, "nonce": N, "model": M, "layers": {"count": n, "pattern": P},
     "tokens": {"from": f, "to": L, "sha256": T}, "tensors": [[layer, name, dtype, shape, D]..]}

N is the decoder's one-time challenge for this attempt (its `ready` line), M the model identity
(config + weights hash), T the digest of (f, L, token ids [0, L)): the rows shipped depend on the
whole prefix. The decode worker `verify`s all of it against what IT expects before admitting the
request; the first mismatch raises `IntegrityError` (a TransportError: the router retries the
request on the local path). SHA-256, not BLAKE2b: with SHA-NI it is the faster of the two here
(benchmarks/results/transport.json `checksum_gbytes_per_s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prfaas.core.errors import TransportError
from prfaas.transport import ReceivedKV

VERSION = 1


class IntegrityError(TransportError):
    """Received KV does not match what the decoder expects (request, attempt, prompt, model,
    layers or a tensor's bytes); the message names the first mismatch."""


def tensor_digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data).hexdigest()


def token_digest(token_ids: Sequence[int], ship_from: int, num_tokens: int) -> str:
    h = hashlib.sha256(np.array([ship_from, num_tokens], dtype="<i8").tobytes())
    h.update(np.asarray(token_ids[:num_tokens], dtype="<i8").tobytes())
    return h.hexdigest()


def model_identity(engine: Any) -> str:
    """SHA-256 of the engine's config (every field but where it runs: device and dtype) and
    of its weights (the engine's `weights_sha256`: every weight's float32 bytes, in name
    order), so a bf16 GPU prefill and an fp32 CPU decoder of one model agree, and two models
    that differ in one weight or one shape do not."""
    config = engine.config
    fields = (config.identity_fields() if hasattr(config, "identity_fields")
              else dataclasses.asdict(config))
    h = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    digest = getattr(engine, "weights_sha256", None)
    if digest is None:  # the emulated engine has no weights: its KV layout is its model
        h.update(repr(getattr(engine, "layout", None)).encode())
        return h.hexdigest()
    h.update(str(digest).encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Binding:
    """What a manifest must say: the decoder's own view of the request."""

    request_id: int
    nonce: str
    model_id: str
    layer_pattern: str  # EngineConfig.layer_pattern, one letter per layer
    ship_from: int
    token_ids: tuple[int, ...]

    def head(self) -> dict[str, Any]:
        n = len(self.token_ids)
        return {"v": VERSION, "request_id": self.request_id, "nonce": self.nonce,
                "model": self.model_id,
                "layers": {"count": len(self.layer_pattern), "pattern": self.layer_pattern},
                "tokens": {"from": self.ship_from, "to": n,
                           "sha256": token_digest(self.token_ids, self.ship_from, n)}}


class ManifestBuilder:
    """Sender side: `add` each tensor as it is queued (its digest runs in a worker thread,
    overlapping compute and transfer); `encode` once every tensor is added."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        self._tensors: list[tuple[int, str, str, list[int], asyncio.Future[str]]] = []

    def add(self, layer: int, name: str, array: np.ndarray) -> None:
        digest = asyncio.get_running_loop().run_in_executor(None, tensor_digest, array)
        self._tensors.append((layer, name, array.dtype.name, list(array.shape), digest))

    async def encode(self) -> bytes:
        tensors = [[layer, name, dtype, shape, await digest]
                   for layer, name, dtype, shape, digest in self._tensors]
        body = {**self.binding.head(), "tensors": sorted(tensors)}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def verify(received: ReceivedKV, expect: Binding, kind_names: dict[str, str]) -> None:
    """Raise IntegrityError unless `received` is exactly what `expect` binds. `kind_names`:
    layer-pattern letter -> wire kind name (e.g. K -> linear, M -> mla)."""
    rid = received.request_id
    try:
        m = json.loads(received.manifest) if received.manifest else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"request {rid}: manifest is not JSON: {exc}") from exc
    if not isinstance(m, dict):
        raise IntegrityError(f"request {rid}: transfer carries no manifest")
    want = expect.head()
    for key in ("v", "request_id", "nonce", "model", "layers", "tokens"):
        if m.get(key) != want[key]:
            raise IntegrityError(f"request {rid}: manifest {key} is {_short(m.get(key))}, "
                                 f"expected {_short(want[key])} ({_WHAT[key]})")
    _check_tensors(received, m.get("tensors"), expect, kind_names)


_WHAT = {"v": "manifest version", "request_id": "a stale transfer of another request",
         "nonce": "not this attempt's challenge: a replayed transfer",
         "model": "KV from a different model or weights",
         "layers": "a different layer stack", "tokens": "KV of another prompt or token range"}


def _check_tensors(received: ReceivedKV, listed: object, expect: Binding,
                   kind_names: dict[str, str]) -> None:
    rid = received.request_id
    if not isinstance(listed, list):
        raise IntegrityError(f"request {rid}: manifest has no tensor list")
    entries = {(int(t[0]), str(t[1])): t for t in listed}
    got = {(layer, name): a for layer, named in received.layers.items()
           for name, a in named.items()}
    for key in sorted(entries.keys() - got.keys()):
        raise IntegrityError(f"request {rid}: layer {key[0]} tensor {key[1]!r} is in the "
                             "manifest but was not received")
    for key in sorted(got.keys() - entries.keys()):
        raise IntegrityError(f"request {rid}: layer {key[0]} tensor {key[1]!r} was received "
                             "but is not in the manifest")
    for i, letter in enumerate(expect.layer_pattern):
        kind = kind_names[letter]
        if i not in received.layers:
            raise IntegrityError(f"request {rid}: layer {i} ({kind}) missing from the transfer")
        if received.kinds.get(i) != kind:
            raise IntegrityError(f"request {rid}: layer {i} arrived as "
                                 f"{received.kinds.get(i)!r}, this model's layer is {kind!r}")
    for key, (_l, _n, dtype, shape, digest) in sorted(entries.items()):
        a = got[key]
        if a.dtype.name != dtype or list(a.shape) != shape:
            raise IntegrityError(f"request {rid}: layer {key[0]} {key[1]!r} is "
                                 f"{a.dtype.name}{list(a.shape)}, manifest says {dtype}{shape} "
                                 "(truncated or reshaped)")
        if tensor_digest(a) != digest:
            raise IntegrityError(f"request {rid}: layer {key[0]} {key[1]!r} bytes do not match "
                                 "the manifest's SHA-256 (altered, reordered or mixed up)")


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
