"""The PrfaaS vLLM instance's TLS front (integrations/vllm/tls_front.py), no vLLM: an HTTP
server on the front's unix socket stands for the instance.

- The router's certificate gets through, a large reply intact (backpressure across the relay).
- A decoder's and the instance's own certificate (same CA, other names) are refused, as are
  plaintext, no certificate and a foreign CA. Negative control: the TLS context vLLM's own
  `--ssl-cert-reqs 2` gives uvicorn (uvicorn.config.create_ssl_context, the same certificates)
  accepts the decoder's certificate: what the front closes.
- The front goes away (port closed, socket folder removed) when its parent process exits.
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from prfaas.integrations.vllm.tls_front import start_front
from prfaas.security.certs import ROUTER, Authority, Member, init_certs
from prfaas.serve.ports import free_port

BIG_BYTES = 8 * 2**20  # many times the relay's socket buffers


class _Api(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def do_GET(self) -> None:
        body = b"ok" if self.path == "/health" else bytes(range(256)) * (BIG_BYTES // 256)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        return


class _UnixHttp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("front")
    init_certs([Member("prfaas-0"), Member("pdd-0"), Member(ROUTER)], root / "certs")
    ca = Authority("a foreign CA")
    ca.write_ca(root / "foreign")
    ca.write_member(root / "foreign", Member(ROUTER))  # the right name, the wrong CA
    return {"certs": root / "certs", "foreign": root / "foreign"}


@pytest.fixture(scope="module")
def front(certs: dict[str, Path]) -> Iterator[str]:
    port = free_port()
    path, proc = start_front(str(certs["certs"]), "prfaas-0", "127.0.0.1", port)
    api = _UnixHttp(path, _Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        api.shutdown()
        api.server_close()
        proc.terminate()
        proc.wait(10)


def _client(certs: dict[str, Path], who: str | None, folder: str = "certs") -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(certs["certs"] / "ca.pem"))
    ctx.check_hostname = False
    if who is not None:
        ctx.load_cert_chain(str(certs[folder] / f"{who}.pem"), str(certs[folder] / f"{who}.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None) -> str:
    try:
        with urllib.request.urlopen(url, timeout=20, context=ctx) as resp:
            return f"HTTP {resp.status} {hashlib.sha256(resp.read()).hexdigest()[:12]}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"refused: {exc}"


def test_router_gets_through_and_a_large_reply_arrives_whole(front: str, certs: dict) -> None:
    router = _client(certs, ROUTER)
    ok = hashlib.sha256(b"ok").hexdigest()[:12]
    assert _get(f"{front}/health", router) == f"HTTP 200 {ok}"
    big = hashlib.sha256(bytes(range(256)) * (BIG_BYTES // 256)).hexdigest()[:12]
    assert _get(f"{front}/big", router) == f"HTTP 200 {big}"


def test_other_members_of_the_ca_and_strangers_are_refused(front: str, certs: dict) -> None:
    for what, ctx in (("a decoder", _client(certs, "pdd-0")),
                      ("the instance's own", _client(certs, "prfaas-0")),
                      ("no certificate", _client(certs, None)),
                      ("foreign CA", _client(certs, ROUTER, "foreign"))):
        assert _get(f"{front}/health", ctx).startswith("refused"), what
    assert _get("http:" + front[len("https:"):] + "/health", None).startswith("refused")


def test_control_vllms_own_tls_lets_a_decoders_certificate_in(certs: dict) -> None:
    """What `--ssl-cert-reqs 2` gave: uvicorn's context from vLLM's --ssl-* values, serving
    the same API; the decoder's certificate gets a 200 there."""
    from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

    d = certs["certs"]
    ctx = create_ssl_context(d / "prfaas-0.pem", d / "prfaas-0.key", None, SSL_PROTOCOL_VERSION,
                             int(ssl.CERT_REQUIRED), d / "ca.pem", None)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/health"
        assert _get(url, _client(certs, "pdd-0")).startswith("HTTP 200")
        assert _get(url, _client(certs, None)).startswith("refused")  # the chain is checked
    finally:
        server.shutdown()
        server.server_close()


def test_front_goes_when_its_parent_exits(certs: dict) -> None:
    port = free_port()
    d = certs["certs"]
    code = f"""if True:
        import socket, ssl, sys
        from prfaas.integrations.vllm.tls_front import start_front
        path, _ = start_front({str(d)!r}, "prfaas-0", "127.0.0.1", {port})
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations({str(d / "ca.pem")!r})
        ctx.load_cert_chain({str(d / "router.pem")!r}, {str(d / "router.key")!r})
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", {port}), timeout=30),
                             server_hostname="prfaas-0") as s:
            print(path, s.version(), flush=True)  # the front answered a handshake
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    path, version = done.stdout.split()
    assert version == "TLSv1.3"
    folder = Path(path).parent
    deadline = time.monotonic() + 30
    while folder.exists() or _listening(port):
        assert time.monotonic() < deadline, "the front outlived its parent"
        time.sleep(0.1)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def test_a_busy_port_is_one_line_naming_it(certs: dict) -> None:
    from prfaas.core.errors import ConfigError

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"workers\.prfaas-0\.port.*{port}"):
            start_front(str(certs["certs"]), "prfaas-0", "127.0.0.1", port)
