"""Token bucket and link monitor under an injected clock (no sleeps, exact numbers)."""

from __future__ import annotations

import socket
import sys

import pytest

from prfaas.core.errors import ConfigError
from prfaas.transport.monitor import LinkMonitor
from prfaas.transport.shaper import TokenBucket
from prfaas.transport.tcpinfo import TcpStats, tcp_retransmits, tcp_stats


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_bucket_passes_the_burst_then_paces_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_gbps=8.0, burst_bytes=1_000_000, clock=clock)  # 1e9 B/s
    assert bucket.take(1_000_000) == 0.0
    assert bucket.take(500_000) == pytest.approx(0.0005)
    # Concurrent callers queue behind the debt: the second waits for both.
    assert bucket.take(500_000) == pytest.approx(0.001)
    clock.now_s += 0.001
    assert bucket.take(0) == pytest.approx(0.0)
    clock.now_s += 10.0  # a long idle refills only up to the burst
    assert bucket.take(3_000_000) == pytest.approx(0.002)


def test_bucket_frame_larger_than_burst_takes_its_link_time() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_gbps=0.8, burst_bytes=1000, clock=clock)  # 1e8 B/s
    assert bucket.take(100_001_000) == pytest.approx(1.0)


def _link_time_s(bucket: TokenBucket, clock: FakeClock, total_bytes: int,
                 frame_bytes: int) -> float:
    """Send total_bytes as one sender would, frame by frame, each after its wait; return the
    time from the first frame's charge to the last frame's release."""
    start_s = clock.now_s
    for _ in range(total_bytes // frame_bytes):
        clock.now_s += bucket.take(frame_bytes)
    return clock.now_s - start_s


def test_default_burst_is_ten_ms_of_link_at_any_rate() -> None:
    assert TokenBucket(rate_gbps=0.01).burst_bytes == 12_500  # 1.25e6 B/s * 10 ms
    assert TokenBucket(rate_gbps=100.0).burst_bytes == 125_000_000


def test_low_rate_link_carries_a_small_kv_at_its_rate() -> None:
    """512 KiB on a 0.01 Gbps (1.25 MB/s) link: 0.419 s of bytes / rate, less at most the
    10 ms burst an idle link lends. Negative control: the old default burst (max(1 MiB, 10 ms))
    lets the same transfer through in no link time at all."""
    kv_bytes, frame_bytes = 512 * 1024, 64 * 1024
    clock = FakeClock()
    bucket = TokenBucket(rate_gbps=0.01, clock=clock)
    took_s = _link_time_s(bucket, clock, kv_bytes, frame_bytes)
    assert kv_bytes / 1.25e6 - 0.010 <= took_s + 1e-9
    assert took_s <= kv_bytes / 1.25e6 + 1e-9
    assert took_s == pytest.approx(0.42, abs=0.015)
    old = TokenBucket(rate_gbps=0.01, burst_bytes=1024 * 1024, clock=clock)
    assert _link_time_s(old, clock, kv_bytes, frame_bytes) == 0.0
    # After an idle second the bucket lends only its burst again, not a second of link.
    clock.now_s += 1.0
    assert _link_time_s(bucket, clock, kv_bytes, frame_bytes) == pytest.approx(took_s)


def test_bucket_rejects_bad_rates() -> None:
    with pytest.raises(ConfigError, match="rate_gbps=0"):
        TokenBucket(rate_gbps=0)
    with pytest.raises(ConfigError, match="burst_bytes=-1"):
        TokenBucket(rate_gbps=1, burst_bytes=-1)


def test_monitor_window_rate_pending_and_retransmits() -> None:
    clock = FakeClock()
    monitor = LinkMonitor(window_s=2.0, clock=clock)
    monitor.add_retransmit_source(lambda: 3)
    monitor.add_retransmit_source(lambda: 4)
    monitor.add_pending(5000)
    monitor.record_sent(1000)
    monitor.remove_pending(1000)
    clock.now_s += 1.5
    monitor.record_sent(3000)
    monitor.remove_pending(3000)
    sample = monitor.sample()
    assert sample.egress_bytes_per_s == pytest.approx(2000.0)
    assert sample.egress_gbps == pytest.approx(16e-6)
    assert (sample.pending_bytes, sample.retransmits, sample.total_sent_bytes) == (1000, 7, 4000)
    clock.now_s += 1.0  # the first record leaves the window
    assert monitor.egress_bytes_per_s() == pytest.approx(1500.0)
    clock.now_s += 5.0
    assert monitor.egress_bytes_per_s() == 0.0


def test_tcp_info_reads_live_kernel_counters() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _addr = listener.accept()
    client.sendall(b"x" * 100_000)
    got = 0
    while got < 100_000:
        got += len(server.recv(65536))
    stats = tcp_stats(client)
    if sys.platform == "linux":
        assert stats.rtt_us > 0 and stats.snd_cwnd_segments > 0
    # Loopback rarely retransmits, but tail-loss probes under CPU starvation can; just check
    # the two readers agree on the kernel's counter.
    assert stats.total_retrans == tcp_retransmits(client)
    for sock in (client, server, listener):
        sock.close()
    assert tcp_stats(client) == TcpStats(0, 0, 0)
