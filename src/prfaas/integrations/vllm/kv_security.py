"""PrfaasConnector's security: mutual TLS on its KV links and the transfer manifest (no vLLM).

TLS (`ConnectorTls.from_extra`, from `kv_connector_extra_config` that integrations/vllm/deploy.py
writes from the topology's `security.tls`): every KV connection is mutual TLS 1.3 with the
topology's certificates (`prfaas certs init`, prfaas.security.tls). A producer sends only to
the decoders of its topology: the destination a request body names must be one of them
(`decoder_name`), and the TLS handshake must show that decoder's certificate (its name as
server_hostname), so a body that names another address, or a listener there without that
certificate, gets no byte. A consumer accepts only the topology's prefill workers' names.

Manifest: the producer digests every tensor it queues (SHA-256, `Ledger.add`) and sends, in the
transfer's END, the same manifest as the native path (serve/worker/manifest.py): request (the
transfer id), nonce (the router's one-time value for this attempt), model identity (its config
and weight files), every layer (attention blocks, each GDN layer's conv and recurrent state),
token range and the token ids' digest, and each tensor's dtype, shape and SHA-256. The consumer
`verify`s it against its own view before it reports the load finished; a mismatch fails the load
(vLLM then ends the request with an error and the router retries on the local path).

Faults (tests only): with PRFAAS_VLLM_FAULT_DIR in a deployment's environment, each producer
watches DIR/NAME.fault (deploy.exec_worker); its content (one of PRODUCER_FAULTS) is applied to
that producer's next transfer and the file removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.security.tls import Identity
from prfaas.serve.worker.manifest import tensor_digest, token_digest

VERSION = 1
FAULT_ENV = "PRFAAS_VLLM_FAULT_DIR"
# drop_state: the GDN conv/recurrent states are not sent (nor listed); truncate: the first KV
# block tensor loses its second half on the wire (the manifest lists it whole); replay: the
# manifest carries the previous transfer's nonce; foreign_model: another model's identity
PRODUCER_FAULTS = ("drop_state", "truncate", "replay", "foreign_model")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".json", ".model", ".txt")


@dataclass(frozen=True, slots=True)
class ConnectorTls:
    name: str  # this instance's topology name (its certificate)
    identity: Identity
    decoders: dict[str, str] = field(default_factory=dict)  # "host:port" -> decoder name
    senders: frozenset[str] = frozenset()  # names a consumer accepts

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ConnectorTls | None:
        """None without `tls_dir`; a ConfigError naming the file for a bad certificate."""
        folder = extra.get("tls_dir")
        if not folder:
            return None
        name = str(extra.get("tls_name") or "")
        if not name:
            raise ConfigError("kv_connector_extra_config.tls_name", name, "needed with tls_dir")
        return cls(name, Identity.load(folder, name),
                   {str(k): str(v) for k, v in dict(extra.get("decoders") or {}).items()},
                   frozenset(str(s) for s in extra.get("senders") or ()))

    def client(self) -> ssl.SSLContext:
        return self.identity.client_context()

    def server(self) -> ssl.SSLContext:
        return self.identity.server_context()

    def decoder_name(self, host: str, port: int) -> str | None:
        return self.decoders.get(f"{host}:{port}")

    def accept(self, peer: str | None) -> bool:
        return peer is not None and peer in self.senders


def model_identity(model_dir: str, detail: str = "") -> str:
    """SHA-256 of the model folder's config, tokenizer and weight files (name and bytes, in
    name order) and `detail` (dtype, cache settings). A folder that is not there (a hub name):
    its name and `detail` only. Read once per worker process; large models pay one read."""
    h = hashlib.sha256(detail.encode())
    root = Path(model_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _WEIGHTS) \
        if root.is_dir() else []
    if not files:
        h.update(model_dir.encode())
    for p in files:
        h.update(str(p.relative_to(root)).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def head(request_id: int, nonce: str, model: str, layers: dict[str, list[int]],
         num_tokens: int, tokens_sha256: str) -> dict[str, Any]:
    """What both ends must agree on besides the tensors. `layers`: {"blocks": attention layer
    indices, "states": GDN/Mamba layer indices} of the model."""
    return {"v": VERSION, "request_id": request_id, "nonce": nonce, "model": model,
            "layers": {k: sorted(v) for k, v in sorted(layers.items())},
            "tokens": {"from": 0, "to": num_tokens, "sha256": tokens_sha256}}


def tokens_sha256(token_ids: list[int], num_tokens: int) -> str:
    return token_digest(token_ids, 0, num_tokens)


Entry = tuple[str, list[int], str]  # dtype, shape, SHA-256


def entry(array: np.ndarray) -> Entry:
    return array.dtype.name, list(array.shape), tensor_digest(array)


@dataclass(slots=True)
class Ledger:
    """One transfer's tensors as queued (producer) or received (consumer)."""

    tensors: dict[tuple[int, str], Entry] = field(default_factory=dict)

    def add(self, layer: int, name: str, array: np.ndarray) -> None:
        self.tensors[(layer, name)] = entry(array)

    def encode(self, top: dict[str, Any]) -> bytes:
        rows = sorted([layer, name, *entry] for (layer, name), entry in self.tensors.items())
        return json.dumps({**top, "tensors": rows}, sort_keys=True,
                          separators=(",", ":")).encode()


_WHAT = {"v": "manifest version", "request_id": "a transfer of another request",
         "nonce": "not this attempt's nonce: a replayed transfer",
         "model": "KV from another model or weights", "layers": "another layer stack",
         "tokens": "KV of another prompt or token range"}


def verify(manifest: bytes, expect: dict[str, Any], received: Ledger) -> str | None:
    """Why the received tensors are not what `expect` (the consumer's own `head`) binds;
    None when every field and every tensor's dtype, shape and SHA-256 match."""
    try:
        m = json.loads(manifest) if manifest else None
    except (ValueError, UnicodeDecodeError) as exc:
        return f"manifest is not JSON: {exc}"
    if not isinstance(m, dict):
        return "the transfer carries no manifest"
    for key in ("v", "request_id", "nonce", "model", "layers", "tokens"):
        if m.get(key) != expect[key]:
            return f"manifest {key} differs ({_WHAT[key]})"
    rows = m.get("tensors")
    if not isinstance(rows, list):
        return "manifest has no tensor list"
    try:
        listed = {(int(r[0]), str(r[1])): (str(r[2]), list(r[3]), str(r[4])) for r in rows}
    except (TypeError, ValueError, IndexError) as exc:
        return f"manifest tensor list is malformed: {exc}"
    for lost in sorted(listed.keys() - received.tensors.keys()):
        return f"layer {lost[0]} {lost[1]!r} is in the manifest but was not received"
    for extra in sorted(received.tensors.keys() - listed.keys()):
        return f"layer {extra[0]} {extra[1]!r} was received but is not in the manifest"
    for (layer, name), (dtype, shape, digest) in sorted(listed.items()):
        got = received.tensors[(layer, name)]
        if (got[0], got[1]) != (dtype, shape):
            return (f"layer {layer} {name!r} is {got[0]}{got[1]}, the manifest says "
                    f"{dtype}{shape} (truncated or reshaped)")
        if got[2] != digest:
            return f"layer {layer} {name!r} bytes do not match the manifest's SHA-256"
    return None


def take_fault(path: str | None) -> str | None:
    """The test fault for the next transfer (the file at `path`), consumed once."""
    if not path:
        return None
    try:
        claimed = f"{path}.{os.getpid()}"
        os.rename(path, claimed)  # atomic: one transfer takes it
    except OSError:
        return None
    fault = Path(claimed).read_text().strip()
    os.unlink(claimed)
    if fault not in PRODUCER_FAULTS:
        raise ConfigError(path, fault, f"unknown; known: {', '.join(PRODUCER_FAULTS)}")
    return fault


def other_model(model: str) -> str:
    return hashlib.sha256(f"another model than {model}".encode()).hexdigest()
