"""TCP_INFO counters of a connected socket (Linux); zeros elsewhere.

Offsets follow `struct tcp_info` in linux/tcp.h, stable since Linux 2.6: 8 bytes of u8 fields,
then u32 fields; tcpi_rtt is at byte 68, tcpi_snd_cwnd at 80, tcpi_total_retrans at 100.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

_TCP_INFO = getattr(socket, "TCP_INFO", None)
_NEEDED_BYTES = 104


@dataclass(frozen=True, slots=True)
class TcpStats:
    total_retrans: int
    rtt_us: int
    snd_cwnd_segments: int


def tcp_stats(sock: socket.socket) -> TcpStats:
    """Kernel counters for `sock`; all zero when TCP_INFO is unavailable or the socket closed."""
    if _TCP_INFO is None or sock.fileno() < 0:
        return TcpStats(0, 0, 0)
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _NEEDED_BYTES)
    except OSError:
        return TcpStats(0, 0, 0)
    if len(raw) < _NEEDED_BYTES:
        return TcpStats(0, 0, 0)
    (rtt_us,) = struct.unpack_from("<I", raw, 68)
    (cwnd,) = struct.unpack_from("<I", raw, 80)
    (retrans,) = struct.unpack_from("<I", raw, 100)
    return TcpStats(retrans, rtt_us, cwnd)


def tcp_retransmits(sock: socket.socket) -> int:
    return tcp_stats(sock).total_retrans
