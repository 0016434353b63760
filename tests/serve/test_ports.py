"""Free ports (serve/ports.py): above Ray's worker ports, below the kernel's ephemeral range,
never one already bound, never the same one twice from one process."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from prfaas.serve import ports


class _Scripted:
    """Draws the given ports in order, then falls back to the real draw."""

    def __init__(self, seq: list[int]) -> None:
        self.seq = list(seq)

    def randrange(self, low: int, high: int) -> int:
        return self.seq.pop(0) if self.seq else ports.random.Random().randrange(low, high)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))
        s.listen()
        yield s.getsockname()[1]


def test_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    got = ports.free_ports(40) + [ports.free_port() for _ in range(40)]
    assert len(set(got)) == 80
    low = ports._ephemeral_low()
    assert all(ports.LOW <= p < low for p in got), (low, got)


def test_a_bound_port_and_a_handed_out_port_are_skipped(listener: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.free_port()
    monkeypatch.setattr(ports, "_draw", _Scripted([listener, first, listener, 20777, 20778]))
    ports._handed_out.discard(20777)
    ports._handed_out.discard(20778)
    assert ports.free_port() not in (listener, first)
    # control: the same draws with both guards off hand out the bound port
    monkeypatch.setattr(ports, "_draw", _Scripted([listener, first]))
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "_bindable", lambda host, port: True)
    assert ports.free_port() == listener


def test_an_address_this_host_does_not_own_is_checked_on_loopback() -> None:
    port = ports.free_port("192.0.2.1")  # TEST-NET-1: never a local address
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free on loopback, as promised


def test_no_free_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_bindable", lambda host, port: False)
    with pytest.raises(RuntimeError, match="found 0 of 2 free ports"):
        ports.free_ports(2)
