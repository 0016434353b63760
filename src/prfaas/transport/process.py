"""A KVReceiver in a child process, driven synchronously: for benchmarks and tests that need
the receiving side on its own core (as a decode node would be), and for sync callers.

The parent says which request to wait for (`expect`) and reads `Completion`s back (`result`)
over a local multiprocessing pipe (never a network) carrying plain tuples of numbers and
strings. The
child reports a crc32 digest of what it received instead of the arrays, so a caller can check
content without shipping it twice. Times are `time.monotonic()`, which is one system-wide clock
on Linux, so they compare with the parent's.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from prfaas.core.errors import TransportError
from prfaas.transport import errors as transport_errors
from prfaas.transport.assembly import ReceivedKV
from prfaas.transport.receiver import KVReceiver, ReceiverConfig


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: int
    num_bytes: int
    first_byte_s: float
    complete_s: float
    digest: int


def digest_arrays(items: list[tuple[int, str, np.ndarray]]) -> int:
    """crc32 over (layer, name, bytes) in (layer, name) order: same on both sides of the wire."""
    crc = 0
    for layer, name, array in sorted(items, key=lambda item: (item[0], item[1])):
        crc = zlib.crc32(f"{layer}:{name}".encode(), crc)
        crc = zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data, crc)
    return crc


def _digest(kv: ReceivedKV) -> int:
    return digest_arrays([(layer, name, a) for layer, named in kv.layers.items()
                          for name, a in named.items()])


TlsFactory = Callable[[], ssl.SSLContext]  # picklable (a functools.partial of a module function)
AllocatorFactory = Callable[[], Callable[[int], np.ndarray]]


async def _child_main(conn: Connection, config: ReceiverConfig, tls: TlsFactory | None,
                      allocate: AllocatorFactory | None) -> None:
    loop = asyncio.get_running_loop()
    alloc = allocate() if allocate is not None else None  # None: config.arena_bytes decides
    async with KVReceiver(config, allocate=alloc, tls=tls() if tls is not None else None) as rx:
        conn.send(("port", rx.port))
        pending: set[asyncio.Task[None]] = set()
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd[0] == "stop":
                break
            task = asyncio.create_task(_wait_one(rx, conn, cmd[1], cmd[2]))
            pending.add(task)
            task.add_done_callback(pending.discard)
        for task in pending:
            task.cancel()


async def _wait_one(rx: KVReceiver, conn: Connection, request_id: int, timeout_s: float) -> None:
    try:
        kv = await rx.wait_request(request_id, timeout_s)
    except TransportError as exc:
        conn.send(("error", request_id, type(exc).__name__, str(exc)))
        return
    conn.send(("done", request_id, kv.num_bytes, kv.first_byte_s, kv.complete_s, _digest(kv)))


def _child(conn: Connection, config: ReceiverConfig, tls: TlsFactory | None,
           allocate: AllocatorFactory | None) -> None:
    asyncio.run(_child_main(conn, config, tls, allocate))


class ReceiverProcess:
    def __init__(self, config: ReceiverConfig | None = None, tls: TlsFactory | None = None,
                 allocate: AllocatorFactory | None = None) -> None:
        """`tls` builds the child's server context there (contexts do not pickle);
        `allocate` its receive-buffer allocator (default: the receive arena the config
        asks for, `ReceiverConfig.arena_bytes`)."""
        self.config = config or ReceiverConfig()
        ctx = mp.get_context("spawn")  # no fork: the parent may hold torch threads
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child_conn, self.config, tls, allocate),
                                 daemon=True)
        self.port = 0

    def __enter__(self) -> ReceiverProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout_s: float = 60.0) -> int:
        self._proc.start()
        tag, port = self._recv(timeout_s, "receiver process start")
        assert tag == "port"
        self.port = port
        return port

    def expect(self, request_id: int, timeout_s: float) -> None:
        """Ask the child to wait for a request (before or after sending it)."""
        self._conn.send(("wait", request_id, timeout_s))

    def result(self, timeout_s: float) -> Completion:
        """The next finished request, in completion order; raises its transport error."""
        msg = self._recv(timeout_s, "receiver process result")
        if msg[0] == "error":
            cls = getattr(transport_errors, msg[2], TransportError)
            raise cls(msg[3])
        return Completion(*msg[1:])

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(("stop",))
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    def _recv(self, timeout_s: float, what: str) -> tuple[Any, ...]:
        if not self._conn.poll(timeout_s):
            raise transport_errors.TransferTimeout(f"{what}: nothing after {timeout_s}s")
        try:
            msg: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise transport_errors.PeerGone(f"{what}: receiver process exited "
                                            f"(exitcode {self._proc.exitcode})") from exc
        return msg
