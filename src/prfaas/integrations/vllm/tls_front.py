"""The PrfaaS vLLM instance's HTTPS front: mutual TLS that only the router's certificate opens.

vLLM's own `--ssl-cert-reqs 2` checks a client certificate's chain, not its name, so any member
of the topology's CA (a decoder, say) would open the instance's API. Instead the instance serves
plain HTTP on a unix socket in a private folder (vLLM's `--uds`, mode 0700: no TCP port at all)
and this front owns the worker's port: it completes each handshake itself (the native workers'
gate, serve/worker/tls_server.accept_tls: TLS 1.3, a client certificate of the topology's CA,
and the name `router`), logs every refusal, then relays the connection's bytes both ways to
the socket (HTTP keep-alive and streaming pass through untouched).

`start_front` runs in the worker process just before it becomes the vLLM server (deploy.
exec_worker): it binds the worker's port there (a busy port fails the start at once), hands the
listening socket to a child `python -m prfaas.integrations.vllm.tls_front`, and returns the
socket path for `--uds`. The child gets SIGTERM when its parent (then vLLM) exits, so the
launcher's pid, SIGTERM and restarts act on vLLM as without TLS, and the front goes with it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable

from prfaas.core.errors import ConfigError
from prfaas.security.certs import ROUTER
from prfaas.security.tls import Identity
from prfaas.serve.worker.tls_server import Refusals, accept_tls, until_signalled

HANDSHAKE_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1


class _Upstream(asyncio.Protocol):
    """vLLM's side of one relayed connection: its bytes go to the caller's TLS transport."""

    def __init__(self, tls: asyncio.Transport) -> None:
        self.tls = tls

    def data_received(self, data: bytes) -> None:
        self.tls.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.tls.close()

    def pause_writing(self) -> None:  # vLLM's socket is full: stop reading the caller
        self.tls.pause_reading()

    def resume_writing(self) -> None:
        self.tls.resume_reading()


class _Relay(asyncio.Protocol):
    """The caller's side: the handshake and identity check, then its bytes to vLLM's socket."""

    def __init__(self, context: ssl.SSLContext, refusals: Refusals, upstream_path: str,
                 accept_name: Callable[[str | None], bool]) -> None:
        self.context, self.refusals = context, refusals
        self.upstream_path, self.accept_name = upstream_path, accept_name
        self.upstream: asyncio.Transport | None = None
        self.pending = bytearray()  # request bytes that came before vLLM's socket was open
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello waits in the kernel for start_tls
        self.task = asyncio.get_running_loop().create_task(self._open(transport))

    async def _open(self, transport: asyncio.Transport) -> None:
        tls = await accept_tls(transport, self, self.context, self.refusals, self.accept_name,
                               HANDSHAKE_TIMEOUT_S)
        if tls is None:
            return
        tls.pause_reading()
        try:
            upstream, _ = await asyncio.get_running_loop().create_unix_connection(
                lambda: _Upstream(tls), self.upstream_path)
        except OSError:  # vLLM not listening yet (starting) or gone: the caller sees a close
            tls.close()
            return
        if self.closed:
            upstream.close()
            return
        self.upstream = upstream
        if self.pending:
            upstream.write(bytes(self.pending))
            self.pending.clear()
        tls.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending += data
        else:
            self.upstream.write(data)

    def eof_received(self) -> bool | None:
        return False  # TLS has no half-close: the transport closes, connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.upstream is not None:
            self.upstream.close()

    def pause_writing(self) -> None:  # the caller reads slowly: stop reading vLLM
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()


async def serve(listener: socket.socket, context: ssl.SSLContext, upstream_path: str,
                accept_name: Callable[[str | None], bool], refusals: Refusals) -> None:
    """Relay `listener`'s accepted callers to `upstream_path` until SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Relay(context, refusals, upstream_path, accept_name), sock=listener)
    try:
        await until_signalled()
    finally:
        server.close()


def only_router(name: str | None) -> bool:
    return name == ROUTER


def start_front(tls_dir: str, name: str, host: str, port: int
                ) -> tuple[str, subprocess.Popen[bytes]]:
    """Bind `host:port` here, start the front on it (a child that gets SIGTERM when this
    process exits) and return the unix socket path vLLM must serve on, and the child.
    Certificates are checked here first."""
    Identity.load(tls_dir, name)  # a bad certificate: one line naming the file, before vLLM
    folder = tempfile.mkdtemp(prefix="prfaas-vllm-")  # 0700: the socket is this user's only
    path = os.path.join(folder, "api.sock")
    try:
        listener = socket.create_server((host, port))
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ConfigError(f"workers.{name}.port", port,
                          f"cannot listen on {host}: {exc.strerror or exc}") from exc
    proc = subprocess.Popen([sys.executable, "-m", "prfaas.integrations.vllm.tls_front",
                             "--fd", str(listener.fileno()), "--tls-dir", tls_dir, "--name",
                             name, "--upstream", path, "--parent", str(os.getpid())],
                            pass_fds=(listener.fileno(),), preexec_fn=_die_with_parent)
    listener.close()  # the child holds it; vLLM (exec'd next) must not inherit it
    return path, proc


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent exits (the kernel's prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--tls-dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format=f"[{args.name} front] %(levelname)s %(message)s")
    try:
        if args.parent and os.getppid() != args.parent:
            return 0  # the parent exited before the death signal was armed
        listener = socket.socket(fileno=args.fd)
        context = Identity.load(args.tls_dir, args.name).server_context()
        asyncio.run(serve(listener, context, args.upstream, only_router, Refusals()))
    finally:
        shutil.rmtree(os.path.dirname(args.upstream), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
