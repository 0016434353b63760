"""Non-blocking socket I/O on the asyncio loop, with a timeout on every await and OS errors
translated into transport errors. Receives go straight into the caller's buffer (no copies)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from prfaas.core.errors import TransportError
from prfaas.transport.errors import PeerGone, TransferTimeout

_T = TypeVar("_T")


def translate(exc: BaseException, what: str) -> TransportError:
    """Map a low-level failure to the project's exception naming the operation."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, TimeoutError):
        return TransferTimeout(f"{what}: timed out")
    if isinstance(exc, ConnectionError | EOFError):
        return PeerGone(f"{what}: peer gone ({type(exc).__name__}: {exc})")
    if isinstance(exc, OSError):
        return PeerGone(f"{what}: socket error ({type(exc).__name__}: {exc})")
    return TransportError(f"{what}: {type(exc).__name__}: {exc}")


async def with_timeout(aw: Awaitable[_T], timeout_s: float | None, what: str) -> _T:
    """Await `aw` under `timeout_s` (None: no limit), translating every failure."""
    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that races
    # with completion, which left receiver.close() waiting on a connection task forever.
    try:
        async with asyncio.timeout(timeout_s):
            return await aw
    except (OSError, TimeoutError, EOFError) as exc:
        raise translate(exc, what) from exc


class Readable(Protocol):
    async def recv_into(self, view: memoryview) -> int: ...


async def recv_exactly(chan: Readable, view: memoryview) -> int:
    """Fill `view` from `chan`; returns the bytes read, fewer than len(view) only at EOF."""
    got = 0
    while got < len(view):
        n = await chan.recv_into(view[got:])
        if n == 0:
            break
        got += n
    return got


def tune(sock: socket.socket) -> None:
    """Non-blocking, no Nagle: END frames are tiny and latency matters. Buffer sizes are left to
    kernel autotuning, which setting SO_SNDBUF/SO_RCVBUF would switch off."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
