"""Byte channels over one non-blocking socket on the asyncio loop: plaintext, or TLS.

`Channel` is the plaintext one (the loop's sock_recv_into / sock_sendall: receives land in the
caller's buffer). `TlsChannel` is a non-blocking `ssl.SSLSocket`: OpenSSL moves the records
itself and decrypts straight into the caller's buffer; the loop waits for readiness. Handshake
failures (no certificate, one from another CA, a name the caller refuses) raise
`TlsRefused` naming the peer. The transport never builds contexts: callers pass them in
(prfaas.security.tls builds them from a topology's certificates).

Big frames move through the `*_sync` methods, called from a worker thread inside `thread_io()`
while the loop leaves the socket alone: a loop wake-up per 64 KiB segment cost more CPU than the
copy itself, and CPython releases the GIL in recv/send and in OpenSSL, so N connections use N
cores. Inside `thread_io()` the socket blocks in the kernel, in slices of `_SLICE_S` (plaintext:
SO_RCVTIMEO/SO_SNDTIMEO; TLS: the socket's timeout, so OpenSSL's retries stay in C), so a
deadline or a `close()` from the loop ends a call promptly. Issue 23's profile: waiting with
non-blocking calls, a Python exception and a fresh poll() per wake-up, cost the receiver about
as much CPU as the kernel's copy; a plaintext payload is now one recv(MSG_WAITALL).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from prfaas.core.errors import TransportError

_SLICE_S = 0.2  # longest single poll() in a worker thread
_IOV_MAX = 512  # buffers per sendmsg (Linux allows 1024)


class TlsRefused(TransportError):
    """A TLS handshake failed or the peer's certificate names a peer we do not accept."""


class Channel:
    """Plaintext: what the socket carries is what the peer sent (frames carry a checksum)."""

    authenticated = False  # no AEAD underneath: payload checksums are required

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self.peer_name: str | None = None  # the certificate's name on a TLS channel
        # Only blocking calls (inside `thread_io`) see these: a slice, then the caller's checks.
        timeo = struct.pack("ll", int(_SLICE_S), int(_SLICE_S % 1 * 1e6))
        for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, opt, timeo)

    async def recv_into(self, view: memoryview) -> int:
        """Some bytes into `view` (at most len(view)); 0 at EOF."""
        return await asyncio.get_running_loop().sock_recv_into(self.sock, view)

    async def sendall(self, data: bytes | memoryview) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def close(self) -> None:
        self.closed = True
        self.sock.close()

    # --- worker-thread side: blocking with a deadline, the loop does not touch the socket ---

    @contextlib.contextmanager
    def thread_io(self) -> Iterator[None]:
        """Around a worker thread's `*_sync` calls: the socket blocks (in slices) meanwhile."""
        self._block_in_slices()
        try:
            yield
        finally:
            if not self.closed:
                with contextlib.suppress(OSError):
                    self.sock.setblocking(False)

    def _block_in_slices(self) -> None:
        self.sock.setblocking(True)  # (SO_RCVTIMEO/SO_SNDTIMEO, set at construction, slice it)

    def recv_exactly_sync(self, view: memoryview, timeout_s: float) -> int:
        """Fill `view`; returns the bytes read, fewer only at EOF. Raises TimeoutError."""
        deadline, got = time.monotonic() + timeout_s, 0
        while got < len(view):
            self._check_open()
            n = self._recv_slice(view[got:])
            if n == 0:
                break
            got += max(n, 0)
            if got < len(view) and time.monotonic() > deadline:
                raise TimeoutError("socket I/O timed out")
        return got

    def _recv_slice(self, view: memoryview) -> int:
        """One blocking receive of at most a slice: bytes read, 0 at EOF, -1 when the slice
        passed with nothing. One recv(MSG_WAITALL): the kernel fills the whole view first."""
        try:
            return self.sock.recv_into(view, 0, socket.MSG_WAITALL)
        except (BlockingIOError, InterruptedError):
            return -1

    def send_parts_sync(self, parts: list[bytes | memoryview], timeout_s: float) -> None:
        """Write every part in order, sendmsg (gather, no concatenation) until all are out."""
        deadline = time.monotonic() + timeout_s
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        while views:
            self._check_open()
            try:
                sent = self.sock.sendmsg(views[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):  # a slice passed with nothing sent
                sent = 0
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views:
                views[0] = views[0][sent:]
                if time.monotonic() > deadline:
                    raise TimeoutError("socket I/O timed out")

    def try_recv_sync(self, view: memoryview) -> int:
        """What is already there, without waiting (0 when nothing or at EOF)."""
        try:
            return self.sock.recv_into(view, 0, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionAbortedError("connection closed")


class TlsChannel(Channel):
    """TLS 1.3 over a non-blocking `ssl.SSLSocket`: OpenSSL reads and writes the socket itself,
    as a plain TLS socket does (records go from the kernel into its buffer and are decrypted
    into the caller's; a frame is encrypted and written by one SSL_write with the GIL
    released). The loop only waits for readiness. Issue 23: over two memory BIOs every record
    was copied twice more on each side (socket -> scratch -> BIO -> OpenSSL, and OpenSSL -> BIO
    -> bytes -> socket), under the GIL for the BIO copies."""

    authenticated = True  # TLS 1.3 AEAD: every record is authenticated and encrypted
    sock: ssl.SSLSocket

    @classmethod
    async def open(cls, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                   peer: str, server_hostname: str | None = None,
                   accept_name: Callable[[str | None], bool] | None = None) -> TlsChannel:
        """Handshake on a connected non-blocking socket (the channel takes it over); raises
        TlsRefused, having closed it (a refusal's alert is already on the wire)."""
        ssock = context.wrap_socket(sock, server_side=server_side,
                                    server_hostname=server_hostname,
                                    do_handshake_on_connect=False)
        chan = cls(ssock)
        try:
            await chan._handshake(peer)
            chan.peer_name = certificate_name(ssock.getpeercert())
            if accept_name is not None and not accept_name(chan.peer_name):
                raise TlsRefused(f"TLS with {peer}: certificate name {chan.peer_name!r} "
                                 f"is not an accepted peer")
        except BaseException:
            chan.close()
            raise
        return chan

    async def _handshake(self, peer: str) -> None:
        try:
            while True:
                try:
                    self.sock.do_handshake()
                    return
                except ssl.SSLWantReadError:
                    await self._ready(select.POLLIN)
                except ssl.SSLWantWriteError:
                    await self._ready(select.POLLOUT)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError) as exc:
            raise TlsRefused(f"TLS with {peer}: peer closed during the handshake") from exc
        except ssl.SSLError as exc:
            raise TlsRefused(f"TLS with {peer}: {exc.reason or exc}") from exc

    async def _ready(self, events: int) -> None:
        """Wait on the loop until the socket is readable (POLLIN) or writable."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.sock.fileno()
        if events == select.POLLIN:
            loop.add_reader(fd, _resolve, ready)
        else:
            loop.add_writer(fd, _resolve, ready)
        try:
            await ready
        finally:
            if events == select.POLLIN:
                loop.remove_reader(fd)
            else:
                loop.remove_writer(fd)

    async def recv_into(self, view: memoryview) -> int:
        while True:
            try:
                return self.sock.recv_into(view)
            except ssl.SSLWantReadError:
                await self._ready(select.POLLIN)
            except ssl.SSLWantWriteError:  # e.g. a key update to answer
                await self._ready(select.POLLOUT)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0
            except ssl.SSLError as exc:
                raise TransportError(f"TLS record from peer: {exc.reason or exc}") from exc

    async def sendall(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            try:
                view = view[self.sock.send(view):]
            except ssl.SSLWantWriteError:  # retried with the same buffer, as OpenSSL requires
                await self._ready(select.POLLOUT)
            except ssl.SSLWantReadError:
                await self._ready(select.POLLIN)

    # --- worker-thread side ---

    def _block_in_slices(self) -> None:
        """A timeout, not plain blocking: OpenSSL's want-read/want-write retries then wait in
        C with the GIL released, and a slice with nothing moved raises TimeoutError (a
        blocking SSLSocket would retry forever inside one call, deaf to close and deadline)."""
        self.sock.settimeout(_SLICE_S)

    def _recv_slice(self, view: memoryview) -> int:
        try:
            return self.sock.recv_into(view)
        except TimeoutError:  # a slice passed with no record
            return -1
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return 0
        except ssl.SSLError as exc:
            raise ConnectionError(f"TLS record from peer: {exc.reason or exc}") from exc

    def send_parts_sync(self, parts: list[bytes | memoryview], timeout_s: float) -> None:
        """Each part in one SSL_write (GIL released while OpenSSL encrypts and writes)."""
        deadline = time.monotonic() + timeout_s
        for part in parts:
            view = memoryview(part).cast("B")
            while view:
                self._check_open()
                try:
                    view = view[self.sock.send(view):]
                except TimeoutError:  # retried with the same buffer, as OpenSSL requires
                    if time.monotonic() > deadline:
                        raise

    def try_recv_sync(self, view: memoryview) -> int:
        """Only what OpenSSL has already decrypted (0 when nothing): anything more could wait."""
        if not self.sock.pending():
            return 0
        try:
            return self.sock.recv_into(view)
        except (ssl.SSLError, OSError):  # nothing decrypted yet, or EOF: the loop finds out
            return 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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

