"""PrfaasConnector's security without vLLM: mutual TLS on its KV links (who may send to whom),
the transfer manifest's checks (each with the tampering it must catch), the instances' TLS
settings from the topology, and the launcher's fast failure on a worker that speaks plain HTTP
where the topology asks for HTTPS."""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from prfaas.integrations.vllm import kv_security as sec
from prfaas.integrations.vllm.link import Finish, RecvLink, SendLink, Tensor
from prfaas.security.certs import Authority, Member, init_certs
from prfaas.security.spec import SecuritySpec
from prfaas.security.tls import Identity
from prfaas.serve.topology import load_topology
from prfaas.transport.receiver import ReceiverConfig
from prfaas.transport.sender import SenderConfig

ROOT = Path(__file__).resolve().parents[3]
NAMES = ("prfaas-0", "pdp-0", "pdd-0", "router")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    init_certs([Member(n) for n in NAMES], out)
    return out


def _wait(link: RecvLink | SendLink, n: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += link.drain()
        time.sleep(0.02)
    return got


def _pair(certs: Path, receiver_name: str, sender_name: str, known_as: str | None
          ) -> tuple[RecvLink, SendLink, list, tuple[str, int]]:
    """A receiver showing `receiver_name`'s certificate (accepting the topology's prefill
    workers) and a sender with `sender_name`'s, to which the receiver's address is the decoder
    `known_as` (None: not a decoder of its topology)."""
    arrived: list = []
    rx = sec.ConnectorTls.from_extra({"tls_dir": str(certs), "tls_name": receiver_name,
                                      "senders": ["prfaas-0", "pdp-0"]})
    assert rx is not None
    recv = RecvLink(ReceiverConfig(port=0, frame_timeout_s=5.0), lambda *t: arrived.append(t),
                    tls=rx.server(), accept_peer=rx.accept)
    dest = ("127.0.0.1", recv.receiver.port)
    decoders = {} if known_as is None else {f"{dest[0]}:{dest[1]}": known_as}
    tx = sec.ConnectorTls.from_extra({"tls_dir": str(certs), "tls_name": sender_name,
                                      "decoders": decoders})
    assert tx is not None
    send = SendLink(SenderConfig(num_connections=2, connect_timeout_s=5.0), tx.client(),
                    tx.decoder_name)
    return recv, send, arrived, dest


def _one_transfer(recv: RecvLink, send: SendLink, dest: tuple[str, int], manifest: bytes = b""
                  ) -> tuple[object, object]:
    recv.expect(3, 5.0)
    send.submit(dest, Tensor(3, 0, "b0", np.arange(512, dtype=np.uint16), bfloat16=True))
    send.submit(dest, Finish(3, manifest))
    [sent] = _wait(send, 1)
    [got] = _wait(recv, 1)
    return sent, got


def test_tls_link_carries_a_transfer_between_topology_members(certs: Path) -> None:
    recv, send, arrived, dest = _pair(certs, "pdd-0", "prfaas-0", "pdd-0")
    try:
        sent, got = _one_transfer(recv, send, dest, b'{"m": 1}')
        assert sent.error is None and got.error is None  # type: ignore[attr-defined]
        assert got.manifest == b'{"m": 1}'  # type: ignore[attr-defined]
        assert len(arrived) == 1 and recv.receiver.stats.tls_refused == 0
    finally:
        send.stop()
        recv.stop()


def test_producer_sends_nothing_to_an_address_that_is_not_a_topology_decoder(certs: Path
                                                                              ) -> None:
    recv, send, arrived, dest = _pair(certs, "pdd-0", "prfaas-0", None)
    try:
        sent, got = _one_transfer(recv, send, dest)
        assert "not the KV port of a decoder" in str(sent.error)  # type: ignore[attr-defined]
        assert got.error is not None and not arrived  # type: ignore[attr-defined]
        assert recv.receiver.stats.connections_accepted == 0  # not even a connection
    finally:
        send.stop()
        recv.stop()


def test_producer_refuses_a_listener_without_the_named_decoders_certificate(certs: Path
                                                                             ) -> None:
    # the address is the decoder pdd-0's for the producer, but the listener there shows the
    # (valid, same-CA) certificate of pdp-0: a body or a port that points elsewhere gets nothing
    recv, send, arrived, dest = _pair(certs, "pdp-0", "prfaas-0", "pdd-0")
    try:
        sent, _ = _one_transfer(recv, send, dest)
        assert "TLS" in str(sent.error) and not arrived  # type: ignore[attr-defined]
    finally:
        send.stop()
        recv.stop()


def test_consumer_refuses_a_sender_that_is_not_a_prefill_worker(certs: Path) -> None:
    recv, send, arrived, dest = _pair(certs, "pdd-0", "router", "pdd-0")  # router: not a sender
    try:
        _, got = _one_transfer(recv, send, dest)
        assert got.error is not None and not arrived  # type: ignore[attr-defined]
        assert recv.receiver.stats.tls_refused >= 1
    finally:
        send.stop()
        recv.stop()


def test_consumer_refuses_plaintext_and_a_foreign_ca(certs: Path, tmp_path: Path) -> None:
    arrived: list = []
    rx = sec.ConnectorTls.from_extra({"tls_dir": str(certs), "tls_name": "pdd-0",
                                      "senders": ["prfaas-0"]})
    assert rx is not None
    recv = RecvLink(ReceiverConfig(port=0, frame_timeout_s=5.0), lambda *t: arrived.append(t),
                    tls=rx.server(), accept_peer=rx.accept)
    foreign = tmp_path / "foreign"
    ca = Authority("another CA")
    ca.write_ca(foreign)
    ca.write_member(foreign, Member("prfaas-0"))  # the right name, the wrong CA
    dest = ("127.0.0.1", recv.receiver.port)
    impostor = Identity.load(foreign, "prfaas-0").client_context()
    impostor.check_hostname = False  # it would not trust pdd-0 either; it tries anyway
    impostor.verify_mode = 0  # type: ignore[assignment]
    senders = [SendLink(SenderConfig(num_connections=1, connect_timeout_s=5.0)),
               SendLink(SenderConfig(num_connections=1, connect_timeout_s=5.0), impostor,
                        lambda h, p: "pdd-0")]
    try:
        for send in senders:
            _one_transfer(recv, send, dest)
        assert not arrived
        assert recv.receiver.stats.tls_refused >= 2
    finally:
        for send in senders:
            send.stop()
        recv.stop()


# -- the manifest -------------------------------------------------------------------------------
def _manifest_case() -> tuple[dict, sec.Ledger, bytes]:
    top = sec.head(9, "n0nce", "model-a", {"blocks": [3], "states": [0, 1, 2]}, 1500,
                   sec.tokens_sha256(list(range(1500)), 1500))
    ledger = sec.Ledger()
    rng = np.random.default_rng(0)
    tensors = {(3, "b0"): rng.integers(0, 2**16, (4, 2, 8), dtype=np.uint16),
               **{(i, "s0"): rng.integers(0, 255, 64, dtype=np.uint8) for i in range(3)}}
    for (layer, name), a in tensors.items():
        ledger.add(layer, name, a)
    return top, ledger, ledger.encode(top)


def test_manifest_verifies_a_genuine_transfer_and_names_each_tampering() -> None:
    top, ledger, manifest = _manifest_case()
    assert sec.verify(manifest, top, ledger) is None
    for key, value, why in (("nonce", "old", "replayed"), ("model", "model-b", "another model"),
                            ("request_id", 10, "another request"),
                            ("tokens", {**top["tokens"], "to": 1499}, "token range"),
                            ("layers", {"blocks": [3], "states": [0, 1]}, "layer stack")):
        assert why in str(sec.verify(manifest, {**top, key: value}, ledger)), key
    dropped = sec.Ledger({k: v for k, v in ledger.tensors.items() if k != (2, "s0")})
    assert "not received" in str(sec.verify(manifest, top, dropped))
    a = np.zeros((4, 2, 8), np.uint16)
    cut = sec.Ledger(dict(ledger.tensors))
    cut.add(3, "b0", a.reshape(-1)[:32])
    assert "truncated" in str(sec.verify(manifest, top, cut))
    flipped = sec.Ledger(dict(ledger.tensors))
    flipped.add(3, "b0", a)
    assert "SHA-256" in str(sec.verify(manifest, top, flipped))
    assert "no manifest" in str(sec.verify(b"", top, ledger))


def test_model_identity_changes_with_a_weight_byte_and_with_the_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 1000)
    one = sec.model_identity(str(tmp_path), "dtype=bf16")
    assert one == sec.model_identity(str(tmp_path), "dtype=bf16")
    assert one != sec.model_identity(str(tmp_path), "dtype=fp32")
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 999 + b"\x01")
    assert one != sec.model_identity(str(tmp_path), "dtype=bf16")


def test_fault_file_is_taken_by_one_transfer(tmp_path: Path) -> None:
    path = str(tmp_path / "prfaas-0.fault")
    assert sec.take_fault(path) is None and sec.take_fault(None) is None
    Path(path).write_text("replay\n")
    assert sec.take_fault(path) == "replay" and sec.take_fault(path) is None
    Path(path).write_text("bogus")
    with pytest.raises(Exception, match="bogus"):
        sec.take_fault(path)


# -- the instances' TLS settings and the launcher -----------------------------------------------
def test_tls_topology_fronts_the_prfaas_instance_and_gives_the_connector_peers(certs: Path
                                                                              ) -> None:
    from prfaas.integrations.vllm.deploy import needs_front, worker_spec

    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    topo = topo.with_security(SecuritySpec(tls_dir=str(certs)))
    pre, pdp, dec = topo.worker("prfaas-0"), topo.worker("pdp-0"), topo.worker("pdd-0")
    assert pre.url.startswith("https://") and not dec.url.startswith("https://")
    # the PrfaaS instance: behind the TLS front (router only), vLLM on a unix socket
    assert needs_front(topo, pre) and not needs_front(topo, pdp) and not needs_front(topo, dec)
    cmd = worker_spec(topo, pre, uds="/x/api.sock").command()
    assert cmd[cmd.index("--uds") + 1] == "/x/api.sock"
    assert not any(a.startswith("--ssl") for a in cmd)  # vLLM's own TLS: any CA member got in
    assert worker_spec(topo, pre).extra["decoders"] == {f"{dec.host}:{dec.kv_port}": "pdd-0"}
    assert worker_spec(topo, pdp).extra["decoders"] == {f"{dec.host}:{dec.kv_port}": "pdd-0"}
    assert worker_spec(topo, dec).extra["senders"] == ["pdp-0", "prfaas-0"]
    plain = worker_spec(load_topology(ROOT / "topologies" / "vllm-local.yaml"), pre)
    assert "tls_dir" not in plain.extra and "--uds" not in plain.command()
    assert not needs_front(load_topology(ROOT / "topologies" / "vllm-local.yaml"), pre)


class _Plain(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def test_launcher_fails_at_once_on_a_worker_that_speaks_plain_http(certs: Path) -> None:
    """What `security: {tls: ...}` on a vLLM topology did before the instances served HTTPS:
    a 600 s wait, then a message naming neither TLS nor vLLM. Now: one line, at once."""
    from prfaas.serve.deploy.launcher import Deployment, DeploymentError

    server = http.server.HTTPServer(("127.0.0.1", 0), _Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    workers = tuple(dataclasses.replace(w, port=server.server_port) if w.name == "prfaas-0"
                    else w for w in topo.workers)
    topo = dataclasses.replace(topo, workers=workers).with_security(
        SecuritySpec(tls_dir=str(certs)))
    dep = Deployment(topo, external=frozenset(w.name for w in topo.workers),
                     start_timeout_s=600)
    t0 = time.monotonic()
    try:
        with pytest.raises(DeploymentError, match=r"prfaas-0 \(engine vllm\) answers plain HTTP"
                           r".*security\.tls"):
            dep._wait_all([("prfaas-0", dep.topology.worker("prfaas-0").url)])
        assert time.monotonic() - t0 < 30
    finally:
        server.shutdown()
        dep.stop()
