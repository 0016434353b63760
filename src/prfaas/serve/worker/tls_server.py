"""Serve an aiohttp app over mutual TLS, counting and logging every refused peer.

aiohttp's own `ssl_context` leaves the handshake to asyncio, which drops a failed one with a
debug-level log and no hook. Here each accepted TCP connection is upgraded with
`loop.start_tls` in a task: a failed handshake (no certificate, one from another CA, not TLS at
all) or a certificate whose name `accept_name` refuses is counted in `Refusals` and logged with
the peer's address; a good one is handed to aiohttp's request handler as if aiohttp had
accepted it. `serve_tls` runs until SIGINT/SIGTERM, then cleans the app up like run_app.
`accept_tls` is the handshake and name check alone (the vLLM TLS front uses it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from prfaas.transport.channel import certificate_name

log = logging.getLogger("prfaas.security")


@dataclass(slots=True)
class Refusals:
    """Peers refused at the TLS handshake (a /metrics counter), with the latest reasons."""

    count: int = 0
    recent: list[str] = field(default_factory=list)

    def add(self, peer: str, reason: str, listener: str) -> None:
        self.count += 1
        self.recent = [*self.recent[-9:], f"{peer}: {reason}"]
        log.warning("%s refused %s: %s", listener, peer, reason)


class _TlsGate(asyncio.Protocol):
    def __init__(self, handler_factory: web.Server, context: ssl.SSLContext, refusals: Refusals,
                 accept_name: Callable[[str | None], bool] | None, timeout_s: float) -> None:
        self.factory, self.context, self.refusals = handler_factory, context, refusals
        self.accept_name, self.timeout_s = accept_name, timeout_s
        self.task: asyncio.Task[None] | None = None
        # asyncio delivers application data that came with the client's Finished before
        # start_tls returns: kept here and replayed to the request handler
        self.early = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello waits in the kernel for start_tls
        self.task = asyncio.get_running_loop().create_task(self._upgrade(transport))

    def data_received(self, data: bytes) -> None:
        self.early += data

    async def _upgrade(self, transport: asyncio.Transport) -> None:
        tls = await accept_tls(transport, self, self.context, self.refusals, self.accept_name,
                               self.timeout_s)
        if tls is None:
            return
        handler = self.factory()
        tls.set_protocol(handler)
        handler.connection_made(tls)
        if self.early:
            handler.data_received(bytes(self.early))


async def accept_tls(transport: asyncio.Transport, protocol: asyncio.Protocol,
                     context: ssl.SSLContext, refusals: Refusals,
                     accept_name: Callable[[str | None], bool] | None, timeout_s: float,
                     listener: str = "HTTPS") -> asyncio.Transport | None:
    """The server side of the handshake on an accepted TCP `transport` (its reading paused),
    `protocol` then receiving the TLS stream; the TLS transport, or None when the peer was
    refused (no TLS, no certificate, another CA, a name `accept_name` refuses), counted in
    `refusals`, logged and closed."""
    peername = transport.get_extra_info("peername")
    peer = f"{peername[0]}:{peername[1]}" if peername else "unknown peer"
    loop = asyncio.get_running_loop()
    try:
        tls = await asyncio.wait_for(
            loop.start_tls(transport, protocol, context, server_side=True), timeout_s)
    except (ssl.SSLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        refusals.add(peer, f"TLS handshake failed: {reason}", listener)
        transport.close()
        return None
    if tls is None:
        return None
    name = certificate_name(tls.get_extra_info("peercert"))
    if accept_name is not None and not accept_name(name):
        refusals.add(peer, f"certificate name {name!r} is not an accepted caller", listener)
        tls.close()
        return None
    return tls


async def until_signalled() -> None:
    """Return on SIGINT or SIGTERM (handled by the running loop): a TLS server's life."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_tls(app: web.Application, host: str, port: int, context: ssl.SSLContext,
                    refusals: Refusals, accept_name: Callable[[str | None], bool] | None = None,
                    handshake_timeout_s: float = 10.0) -> None:
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = runner.server
    assert server is not None
    listener = await loop.create_server(
        lambda: _TlsGate(server, context, refusals, accept_name, handshake_timeout_s),
        host, port, reuse_address=True)
    try:
        await until_signalled()
    finally:
        listener.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(listener.wait_closed(), 1.0)
        await runner.cleanup()
