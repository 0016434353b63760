"""`link: {compression: ...}` in a topology, and what the router makes of compressed transfers:
egress counts the bytes that crossed the wire, transfer predictions the measured wire share."""

from __future__ import annotations

import pytest
from serve_helpers import topology

from prfaas.core.errors import ConfigError
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.topology import parse_topology


def test_compression_parses_round_trips_and_refuses_unknown_codecs() -> None:
    t = topology(link={"rate_gbps": 0.5, "compression": "auto"},
                 intra_link={"rate_gbps": None, "compression": "lz4"})
    assert (t.link.compression, t.intra_link.compression) == ("auto", "lz4")
    assert parse_topology(t.to_dict()).link == t.link  # round-trips through the dump
    assert topology(link={"rate_gbps": 0.5}).link.compression == "none"  # the default
    with pytest.raises(ConfigError) as info:
        topology(link={"rate_gbps": 0.5, "compression": "brotli"})
    assert str(info.value) == ("link.compression='brotli': must be one of none, lz4, zstd, "
                               "auto")
    with pytest.raises(ConfigError, match=r"intra_link\.compression=True"):
        topology(intra_link={"compression": True})


def test_router_counts_wire_bytes_and_predicts_with_the_measured_wire_share() -> None:
    topo = topology(link={"rate_gbps": 0.5, "compression": "zstd"})
    cluster = LiveCluster(topo, engine_backend(topo).card().kv)
    prfaas, pdp = topo.worker("prfaas-0"), topo.worker("pdp-0")
    raw = cluster.kv_expected_bytes(prfaas, 1000)
    assert cluster.wire_fraction(prfaas) == 1.0  # nothing reported yet: tensor bytes
    cluster.shipped(prfaas, 1_000_000, 800_000)
    assert cluster.monitor.total_sent_bytes == 800_000  # egress: what crossed the link
    assert cluster.wire_fraction(prfaas) == pytest.approx(1 - 0.2 * 0.2)  # EWMA toward 0.8
    assert cluster.kv_expected_bytes(prfaas, 1000) < raw
    assert cluster.wire_fraction(pdp) == 1.0  # the intra link learns on its own
    cluster.shipped(prfaas, 1_000_000)  # a worker that does not say: tensor bytes, no change
    assert cluster.monitor.total_sent_bytes == 1_800_000
    assert cluster.wire_fraction(prfaas) == pytest.approx(0.96)
