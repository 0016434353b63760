"""A load generator `Result`'s account of the router's decision."""

from __future__ import annotations

from prfaas.bench.loadgen import Result


def _result(prfaas: dict[str, str]) -> Result:
    return Result(index=0, input_bytes=1, max_tokens=1, prfaas=prfaas)


def test_first_route_is_the_routers_first_decision_before_any_retry() -> None:
    assert _result({"first_route": "prfaas", "route": "pd"}).first_route == "prfaas"  # retried
    assert _result({"route": "pd"}).first_route == "pd"  # no retry: the route is the first
    assert _result({}).first_route == ""
