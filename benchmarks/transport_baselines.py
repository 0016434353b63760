"""Baselines for bench_transport.py: N plain TCP (or TLS) connections moving one buffer, no framing.

The receiving child process accepts N connections, receives each one's share straight into a
preallocated buffer with blocking recv_into in one thread per connection (CPython releases the
GIL in recv and in OpenSSL), and reports time.monotonic() when every byte has arrived. The
sender connects (and handshakes) first, then starts the clock and sendall()s each share from its
own thread. With `tls_dir` both sides use the same mutual TLS 1.3 contexts as prfaas.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from prfaas.core.units import bytes_per_s_to_gbps
from prfaas.security.tls import Identity


def _shares(total: int, n: int) -> list[tuple[int, int]]:
    step = -(-total // n)
    return [(off, min(off + step, total)) for off in range(0, total, step)]


def _recv_share(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise SystemExit("baseline: sender closed early")
        got += k


def _child(conn: Connection, total: int, tls_dir: str | None) -> None:
    ctx = Identity.load(tls_dir, "rx").server_context() if tls_dir else None
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    conn.send(lsock.getsockname()[1])
    view = memoryview(bytearray(total))
    while (n := conn.recv()) is not None:
        socks: list[socket.socket] = []
        for _ in range(n):
            sock, _addr = lsock.accept()
            socks.append(ctx.wrap_socket(sock, server_side=True) if ctx else sock)
        conn.send("ready")
        threads = [threading.Thread(target=_recv_share, args=(s, view[a:b]))
                   for s, (a, b) in zip(socks, _shares(total, n), strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.send(time.monotonic())
        for s in socks:
            s.close()


class Baseline:
    """A receiving child kept across runs, so runs of every transport can be interleaved."""

    def __init__(self, total: int, tls_dir: str | None = None) -> None:
        mpctx = mp.get_context("spawn")
        self._conn, child = mpctx.Pipe()
        self._proc = mpctx.Process(target=_child, args=(child, total, tls_dir), daemon=True)
        self._proc.start()
        self.port = self._conn.recv()
        self.total = total
        self.ctx = Identity.load(tls_dir, "tx").client_context() if tls_dir else None

    def run(self, buf: np.ndarray, n: int) -> float:
        """Goodput (Gbps) of one transfer of `total` bytes over `n` connections."""
        self._conn.send(n)
        socks = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", self.port))
            socks.append(self.ctx.wrap_socket(sock, server_hostname="rx") if self.ctx else sock)
        assert self._conn.recv() == "ready"
        data = buf[: self.total].data
        threads = [threading.Thread(target=s.sendall, args=(data[a:b],))
                   for s, (a, b) in zip(socks, _shares(self.total, n), strict=True)]
        start_s = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done_s = self._conn.recv()
        for s in socks:
            s.close()
        return bytes_per_s_to_gbps(self.total / (done_s - start_s))

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(10)
