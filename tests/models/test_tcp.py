"""The TCP path model: Mathis' bound, connections, the rate cap, and no effect by default."""

import math

import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.tcp import MATHIS_C, TcpPath


def test_defaults_bound_nothing() -> None:
    path = TcpPath()
    assert path.mathis_gbps() is None and path.transfer_cap_gbps() is None
    assert path.effective_gbps(100.0) == 100.0 and path.rtt_s == 0.0


def test_mathis_bound_by_hand() -> None:
    path = TcpPath(rtt_ms=10.0, loss=1e-4, connections=4, mss_bytes=1000)
    one = 1.2247448713915890 * 1000 * 8 / (0.010 * 0.01) / 1e9  # C * MSS / (RTT sqrt p)
    assert path.mathis_gbps() == pytest.approx(one)
    assert abs(MATHIS_C - 1.2247) < 1e-4
    assert path.transfer_cap_gbps() == pytest.approx(4 * one)
    assert path.effective_gbps(0.1) == 0.1  # the link rate caps the sum
    assert path.effective_gbps(100.0) == pytest.approx(4 * one)
    # a sender's own ceiling binds when lower than the loss bound
    capped = TcpPath(rtt_ms=10.0, loss=1e-4, connections=4, mss_bytes=1000,
                     per_connection_gbps=0.05)
    assert capped.transfer_cap_gbps() == pytest.approx(0.2)


def test_loss_for_inverts_the_bound() -> None:
    p = TcpPath.loss_for(14.7, 29.75)
    assert TcpPath(29.75, p).mathis_gbps() == pytest.approx(14.7)
    assert TcpPath(29.75, 4 * p).mathis_gbps() == pytest.approx(14.7 / 2)  # 1 / sqrt(p)
    assert math.isclose(TcpPath(59.5, p).mathis_gbps() or 0, 14.7 / 2)  # 1 / RTT


@pytest.mark.parametrize("kwargs,key", [
    ({"rtt_ms": -1.0}, "rtt_ms"), ({"loss": 1.0}, "loss"), ({"loss": -0.1}, "loss"),
    ({"connections": 0}, "connections"), ({"mss_bytes": 0}, "mss_bytes"),
    ({"per_connection_gbps": 0.0}, "per_connection_gbps"),
])
def test_bad_values_name_the_key(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        TcpPath(**kwargs)  # type: ignore[arg-type]
