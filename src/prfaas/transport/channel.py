"""Byte channels over one non-blocking socket on the asyncio loop: plaintext, or TLS.

`Channel` is the plaintext one (the loop's sock_recv_into / sock_sendall: receives land in the
caller's buffer). `TlsChannel` runs an `ssl.SSLObject` over two memory BIOs: the loop moves
ciphertext, OpenSSL decrypts straight into the caller's buffer and encrypts a whole frame in one
call. Handshake failures (no certificate, one from another CA, a name the caller refuses) raise
`TlsRefused` naming the peer. The transport never builds contexts: callers pass them in
(prfaas.security.tls builds them from a topology's certificates).

Big frames move through the `*_sync` methods, called from a worker thread while the loop leaves
the socket alone: a loop wake-up per 64 KiB segment cost more CPU than the copy itself, and
CPython releases the GIL in recv/send and in OpenSSL, so N connections use N cores. They wait
with poll() in short slices, so a deadline or a `close()` from the loop ends them promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from prfaas.core.errors import TransportError

_SCRATCH_BYTES = 256 * 1024  # ciphertext read per recv: several 16 KiB TLS records
_SLICE_S = 0.2  # longest single poll() in a worker thread
_IOV_MAX = 512  # buffers per sendmsg (Linux allows 1024)
_TLS_SLICE_BYTES = 256 * 1024  # plaintext encrypted per step before it goes on the wire


class TlsRefused(TransportError):
    """A TLS handshake failed or the peer's certificate names a peer we do not accept."""


class Channel:
    """Plaintext: what the socket carries is what the peer sent (frames carry a checksum)."""

    authenticated = False  # no AEAD underneath: payload checksums are required

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self.peer_name: str | None = None  # the certificate's name on a TLS channel

    async def recv_into(self, view: memoryview) -> int:
        """Some bytes into `view` (at most len(view)); 0 at EOF."""
        return await asyncio.get_running_loop().sock_recv_into(self.sock, view)

    async def sendall(self, data: bytes | memoryview) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def send_frame(self, header: bytes, payload: bytes | memoryview) -> None:
        """Header and payload in one sendmsg (no concatenation copy); the rest via the loop."""
        sent = 0
        with contextlib.suppress(BlockingIOError, InterruptedError):
            sent = self.sock.sendmsg([header, payload])
        if sent < len(header):
            await self.sendall(memoryview(header)[sent:])
            sent = len(header)
        if sent - len(header) < len(payload):
            await self.sendall(memoryview(payload)[sent - len(header):])

    def close(self) -> None:
        self.closed = True
        self.sock.close()

    # --- worker-thread side: blocking with a deadline, the loop does not touch the socket ---

    def recv_exactly_sync(self, view: memoryview, timeout_s: float) -> int:
        """Fill `view`; returns the bytes read, fewer only at EOF. Raises TimeoutError."""
        deadline, got = time.monotonic() + timeout_s, 0
        while got < len(view):
            n = self._recv_some_sync(view[got:], deadline)
            if n == 0:
                break
            got += n
        return got

    def send_parts_sync(self, parts: list[bytes | memoryview], timeout_s: float) -> None:
        """Write every part in order, sendmsg (gather, no concatenation) until all are out."""
        deadline = time.monotonic() + timeout_s
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        while views:
            try:
                sent = self.sock.sendmsg(views[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                self._wait(select.POLLOUT, deadline)
                continue
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views:
                views[0] = views[0][sent:]

    def try_recv_sync(self, view: memoryview) -> int:
        """What is already there, without waiting (0 when nothing or at EOF)."""
        try:
            return self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0

    def _recv_some_sync(self, view: memoryview, deadline: float) -> int:
        while True:
            try:
                return self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                self._wait(select.POLLIN, deadline)

    def _wait(self, events: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(self.sock, events)
        while not poller.poll(_SLICE_S * 1000):
            if self.closed:
                raise ConnectionAbortedError("connection closed")
            if time.monotonic() > deadline:
                raise TimeoutError("socket I/O timed out")


class TlsChannel(Channel):
    authenticated = True  # TLS 1.3 AEAD: every record is authenticated and encrypted

    def __init__(self, sock: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        super().__init__(sock)
        self.obj, self._in, self._out = obj, incoming, outgoing
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))

    @classmethod
    async def open(cls, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                   peer: str, server_hostname: str | None = None,
                   accept_name: Callable[[str | None], bool] | None = None) -> TlsChannel:
        """Handshake on a connected socket; raises TlsRefused (the socket stays open)."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = context.wrap_bio(incoming, outgoing, server_side=server_side,
                               server_hostname=server_hostname)
        chan = cls(sock, obj, incoming, outgoing)
        try:
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await chan._flush()
                    if not await chan._fill():
                        raise TlsRefused(f"TLS with {peer}: peer closed during the handshake"
                                         ) from None
            await chan._flush()
        except ssl.SSLError as exc:
            with contextlib.suppress(OSError):
                await chan._flush()  # the alert, so the peer learns why
            raise TlsRefused(f"TLS with {peer}: {exc.reason or exc}") from exc
        chan.peer_name = certificate_name(obj.getpeercert())
        if accept_name is not None and not accept_name(chan.peer_name):
            raise TlsRefused(f"TLS with {peer}: certificate name {chan.peer_name!r} "
                             f"is not an accepted peer")
        return chan

    async def recv_into(self, view: memoryview) -> int:
        while True:
            try:
                return int(self.obj.read(len(view), view))  # with a buffer: a count
            except ssl.SSLWantReadError:
                if self._out.pending:  # e.g. a key update to answer
                    await self._flush()
                if not await self._fill():
                    return 0
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0
            except ssl.SSLError as exc:
                raise TransportError(f"TLS record from peer: {exc.reason or exc}") from exc

    async def sendall(self, data: bytes | memoryview) -> None:
        self._encrypt(data)
        await self._flush()

    async def send_frame(self, header: bytes, payload: bytes | memoryview) -> None:
        self._encrypt(header)
        self._encrypt(payload)
        await self._flush()

    def _encrypt(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:  # a memory BIO never blocks a write: one call encrypts all of it
            n = self.obj.write(view)
            view = view[n:]

    def send_parts_sync(self, parts: list[bytes | memoryview], timeout_s: float) -> None:
        """Encrypt and send in slices, so the wire (and the receiver) work while the next
        slice is encrypted, as SSL_write on a socket would, instead of encrypting a whole
        batch first."""
        deadline = time.monotonic() + timeout_s
        for part in parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), _TLS_SLICE_BYTES):
                self._encrypt(view[start : start + _TLS_SLICE_BYTES])
                if self._out.pending >= _TLS_SLICE_BYTES:
                    super().send_parts_sync([self._out.read()], deadline - time.monotonic())
        if self._out.pending:
            super().send_parts_sync([self._out.read()], deadline - time.monotonic())

    def try_recv_sync(self, view: memoryview) -> int:
        try:
            return int(self.obj.read(len(view), view))  # with a buffer: a count
        except ssl.SSLError:  # nothing decrypted yet (want read), or EOF: the loop finds out
            return 0

    def _recv_some_sync(self, view: memoryview, deadline: float) -> int:
        while True:
            try:
                return int(self.obj.read(len(view), view))  # with a buffer: a count
            except ssl.SSLWantReadError:
                if self._out.pending:
                    super().send_parts_sync([self._out.read()], deadline - time.monotonic())
                n = super()._recv_some_sync(self._scratch, deadline)
                if n == 0:
                    self._in.write_eof()
                    return 0
                self._in.write(self._scratch[:n])
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0
            except ssl.SSLError as exc:
                raise ConnectionError(f"TLS record from peer: {exc.reason or exc}") from exc

    async def _flush(self) -> None:
        if self._out.pending:
            await asyncio.get_running_loop().sock_sendall(self.sock, self._out.read())

    async def _fill(self) -> bool:
        n = await asyncio.get_running_loop().sock_recv_into(self.sock, self._scratch)
        if n == 0:
            self._in.write_eof()
            return False
        self._in.write(self._scratch[:n])
        return True


def certificate_name(cert: Any) -> str | None:
    """The peer's name: its first DNS subjectAltName, else its subject commonName."""
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "DNS":
            return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None

