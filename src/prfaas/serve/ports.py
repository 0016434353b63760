"""Free TCP ports for the processes a deployment starts.

A port is found free, released, and bound again by the process it is handed to a moment later.
Two things can take it in between, and both did in the test suite: the kernel's `bind(port 0)`
draws at random from the ephemeral range, so two draws in one process can return the same
port; and every outgoing connection takes its source port from that same range. So ports are
drawn here from above 20000 (Ray's worker ports end at 19999) and below the kernel's
ephemeral range, and this process never hands out the same port twice.
"""

from __future__ import annotations

import errno
import random
import socket
import threading
from pathlib import Path

LOW = 20001  # Ray's default worker ports are 10002-19999
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_lock = threading.Lock()
_draw = random.Random()  # seeded from the OS: two processes draw different sequences


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL or host == "127.0.0.1":
                return False
            # an address this namespace does not own (a PrfaaS worker's own namespace,
            # where every port is free): one free on loopback
            return _bindable("127.0.0.1", port)
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now, none handed out before by this process."""
    high = _ephemeral_low()
    if high - LOW < 1000:  # an ephemeral range reaching down to 20000: draw inside it
        high = 65536
    out: list[int] = []
    with _lock:
        for _ in range(50 * count + 200):
            if len(out) == count:
                break
            port = _draw.randrange(LOW, high)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                out.append(port)
    if len(out) < count:
        raise RuntimeError(f"found {len(out)} of {count} free ports in {LOW}-{high - 1} on {host}")
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on `host` now (see `free_ports`)."""
    return free_ports(1, host)[0]
