"""A TLS topology with an API key, live: exact tokens through both routes; the PrfaaS worker's
HTTPS and the decode worker's KV port refuse a plaintext client, a client with a certificate
from another CA and one with no certificate (counted in their /metrics); the router answers 401
without the right key and 200 to the official `openai` client with it."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from security_helpers import KEY, Certs, request, topology

from prfaas.security.certs import Member, init_certs
from prfaas.security.tls import Identity
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.native import engine_config

LONG = "The prefill cluster streams KVCache layer by layer across datacenters. " * 6


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls-live")
    init_certs([Member(n) for n in ("prfaas-0", "pdp-0", "pdd-0", "router")], d)
    return d


@pytest.fixture(scope="module")
def live(tls_dir: Path) -> Iterator[Deployment]:
    topo = topology(security={"tls": {"dir": str(tls_dir)}})
    with Deployment(topo, api_key=KEY) as dep:
        yield dep


@pytest.fixture(scope="module")
def engine() -> Any:
    from prfaas.engine import Engine

    return Engine(engine_config(topology().model))


def _router_ctx(tls_dir: Path) -> ssl.SSLContext:
    ctx = Identity.load(tls_dir, "router").client_context()
    ctx.check_hostname = False
    return ctx


def test_tls_is_on_and_both_routes_give_exact_tokens(live: Deployment, engine: Any) -> None:
    prfaas = live.topology.worker("prfaas-0")
    assert prfaas.url.startswith("https://") and live.topology.security.tls
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)
    for prompt, route in (("short prompt over TLS", "pd"), (LONG, "prfaas")):
        reply = client.completions.create(model="prfaas-tiny-kda", prompt=prompt, max_tokens=6,
                                          temperature=0)
        extra = reply.model_extra or {}
        p = extra["prfaas"]
        assert p["route"] == route and not p["retried"], p
        assert p["token_ids"] == engine.generate(engine.tokenizer.encode(prompt), 6)
    assert reply.usage is not None and reply.usage.completion_tokens == 6


def test_api_key_none_or_wrong_is_401_health_stays_open(live: Deployment) -> None:
    body = {"model": "prfaas-tiny-kda", "prompt": "hi", "max_tokens": 2}
    for key in (None, "sk-wrong-key-000000"):
        status, reply = request(f"{live.url}/v1/completions", body, key)
        assert status == 401, reply
        assert reply["error"]["code"] == "invalid_api_key"
        assert reply["error"]["type"] == "invalid_request_error"
    assert request(f"{live.url}/v1/models")[0] == 401
    assert request(f"{live.url}/health")[0] == 200
    status, text = request(f"{live.url}/metrics")  # open unless security.metrics: protected
    assert status == 200 and 'prfaas_http_errors_total{status="401"}' in text
    bad = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-wrong-key-000000",
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="prfaas-tiny-kda", prompt="hi", max_tokens=2)


def _plaintext(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            return repr(s.recv(4096))
        except OSError as exc:
            return repr(exc)


def _tls(host: str, port: int, ca: Path, cert: tuple[Path, Path] | None) -> str:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    with socket.create_connection((host, port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                return repr(s.recv(4096))
        except (ssl.SSLError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"


def _refused(live: Deployment, tls_dir: Path, listener: str) -> float:
    w = live.topology.worker("prfaas-0" if listener == "http" else "pdd-0")
    _, text = request(f"{w.url}/metrics", context=_router_ctx(tls_dir) if w.tls else None)
    for row in text.splitlines():
        if row.startswith(f'prfaas_tls_refused_total{{listener="{listener}"}}'):
            return float(row.split()[-1])
    raise AssertionError(text)


@pytest.mark.parametrize("client", ["plaintext", "foreign_ca", "no_certificate"])
@pytest.mark.parametrize("listener", ["http", "kv"])
def test_unauthenticated_clients_are_refused(live: Deployment, tls_dir: Path, certs: Certs,
                                             listener: str, client: str) -> None:
    w = live.topology.worker("prfaas-0" if listener == "http" else "pdd-0")
    port = w.port if listener == "http" else w.kv_port
    before = _refused(live, tls_dir, listener)
    if client == "plaintext":
        outcome = _plaintext(w.host, port)
    elif client == "foreign_ca":
        outcome = _tls(w.host, port, tls_dir / "ca.pem",
                       (certs.foreign / "prfaas-0.pem", certs.foreign / "prfaas-0.key"))
    else:
        outcome = _tls(w.host, port, tls_dir / "ca.pem", None)
    assert "HTTP/1.1 200" not in outcome and '"ok"' not in outcome, outcome
    for _ in range(100):  # counted once the worker's side of the handshake has run
        if _refused(live, tls_dir, listener) == before + 1:
            break
    assert _refused(live, tls_dir, listener) == before + 1, outcome
    log = live.log_tail(w.name, 20000)
    assert "refused 127.0.0.1:" in log


def test_the_router_certificate_opens_the_prfaas_worker(live: Deployment, tls_dir: Path) -> None:
    w = live.topology.worker("prfaas-0")
    status, body = request(f"{w.url}/health", context=_router_ctx(tls_dir))
    assert status == 200 and body["name"] == "prfaas-0"
    # a valid certificate of this CA that is not the router's may not call the control API
    outcome = _tls(w.host, w.port, tls_dir / "ca.pem", (tls_dir / "pdp-0.pem",
                                                       tls_dir / "pdp-0.key"))
    assert "HTTP/1.1 200" not in outcome, outcome
