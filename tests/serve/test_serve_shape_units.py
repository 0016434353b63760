"""The router's side of a role change, in process (no workers): the states a change goes
through (draining while work is in flight, drained, switching, joined), what the policy sees at
each, the worker's new role in the topology, /health and /metrics, refusals with their reason,
a failed change restoring the old role, an abandoned one, bad input; and the live router's and
the simulator's adapters feeding the controller the same window."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from serve_helpers import topology

from prfaas.core.errors import ConfigError
from prfaas.core.types import RequestInfo, Route, RouteDecision, RouteQuery
from prfaas.serve.router import shape as live_shape
from prfaas.serve.router.service import RouterService

FOUR = [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pd-0", "role": "pd-p"},
        {"name": "pd-1", "role": "pd-d"}, {"name": "pd-2", "role": "pd-d"}]
QUIET = {"interval_s": 60.0}  # no health check of the absent workers during a test


def _service(**shape: Any) -> RouterService:
    return RouterService(topology(workers=FOUR, health=QUIET,
                                  shape={"period_s": 1e5, "hold_s": 600, **shape}))


def _names(svc: RouterService, role: str) -> set[str]:
    return {i.instance_id for i in svc.cluster.view().instances("pd", role)}  # type: ignore[arg-type]


async def _with_client(svc: RouterService, body: Any) -> Any:
    async with TestClient(TestServer(svc.app())) as client:
        return await body(client)


def test_a_change_drains_switches_and_joins_in_its_new_role() -> None:
    svc = _service()
    assert svc.shape is not None

    async def body(client: TestClient) -> None:
        svc.cluster.start("pd-1")  # a request decoding on pd-1
        r = await client.post("/shape/change", json={"instance": "pd-1", "role": "pd-p"})
        assert r.status == 200, await r.text()
        state = await (await client.get("/shape")).json()
        assert state["change"]["state"] == "draining" and state["change"]["inflight"] == 1
        assert _names(svc, "decode") == {"pd-2"}  # no new work for it
        svc.shape.step()
        assert svc.shape.current is not None and svc.shape.current.state == "draining"
        r = await client.post("/shape/switch", json={"instance": "pd-1"})
        assert r.status == 409  # not drained yet: the deployment must wait
        await asyncio.sleep(0.05)
        svc.cluster.finish("pd-1")
        svc.shape.step()
        assert svc.shape.current.state == "drained"
        r = await client.post("/shape/join", json={"instance": "pd-1", "ok": True})
        assert r.status == 409  # not switching
        assert (await client.post("/shape/switch", json={"instance": "pd-1"})).status == 200
        assert "pd-1" in svc.membership.switching
        r = await client.post("/shape/join", json={"instance": "pd-1", "ok": True,
                                                   "host": "127.0.0.1", "port": 4321,
                                                   "kv_port": 0, "pid": 77})
        assert r.status == 200, await r.text()
        done = await r.json()
        assert done["ok"] and done["drain_s"] >= 0.05 and (done["from"], done["to"]) == (
            "pd-d", "pd-p")
        health = await (await client.get("/health")).json()
        member = health["members"]["pd-1"]
        assert member["role"] == "pd-p" and member["role_changes"] == 1
        assert member["pid"] == 77 and member["up"] and not member["switching"]
        metrics = await (await client.get("/metrics")).text()
        assert 'prfaas_worker_role{role="pd-p",worker="pd-1"} 1.0' in metrics
        assert 'prfaas_shape_decisions_total{outcome="completed"} 1.0' in metrics

    asyncio.run(_with_client(svc, body))
    assert svc.topology.worker("pd-1").role == "pd-p"
    assert svc.topology.worker("pd-1").port == 4321
    assert _names(svc, "prefill") == {"pd-0", "pd-1"} and _names(svc, "decode") == {"pd-2"}
    assert svc.shape.controller.busy is None


def test_refusals_say_why_and_bad_input_is_400() -> None:
    svc = _service(hold_s=600)

    async def body(client: TestClient) -> None:
        async def change(instance: str, role: str) -> tuple[int, dict[str, Any]]:
            r = await client.post("/shape/change", json={"instance": instance, "role": role})
            return r.status, await r.json()

        status, got = await change("pd-0", "pd-d")  # the only PD-P instance
        assert status == 409 and got["refused"]["kind"] == "empty_role"
        status, got = await change("pd-1", "pd-d")
        assert status == 409 and got["refused"]["kind"] == "same_role"
        status, got = await change("prfaas-0", "pd-d")
        assert status == 409 and got["refused"]["kind"] == "unknown"
        assert (await client.post("/shape/change", json={"instance": "pd-1"})).status == 400
        assert (await client.post("/shape/change", data=b"not json")).status == 400
        status, got = await change("pd-1", "pd-p")  # allowed ...
        assert status == 200
        status, got = await change("pd-2", "pd-p")  # ... and now busy
        assert status == 409 and got["refused"]["kind"] == "busy"
        svc.shape.step()
        await client.post("/shape/switch", json={"instance": "pd-1"})
        await client.post("/shape/join", json={"instance": "pd-1", "ok": True, "port": 1})
        status, got = await change("pd-1", "pd-d")  # undoing it within hold_s: a flap
        assert status == 409 and got["refused"]["kind"] == "flap"
        metrics = await (await client.get("/metrics")).text()
        for kind in ("empty_role", "same_role", "unknown", "busy", "flap"):
            assert f'prfaas_shape_decisions_total{{outcome="refused_{kind}"}} 1.0' in metrics

    asyncio.run(_with_client(svc, body))


def test_a_failed_change_restores_the_old_role_and_an_abandoned_one_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc = _service()

    async def body(client: TestClient) -> None:
        await client.post("/shape/change", json={"instance": "pd-2", "role": "pd-p"})
        svc.shape.step()
        await client.post("/shape/switch", json={"instance": "pd-2"})
        r = await client.post("/shape/join", json={"instance": "pd-2", "ok": False,
                                                   "detail": "pd-p did not start",
                                                   "port": 999, "kv_port": 998, "pid": 5})
        done = await r.json()
        assert not done["ok"] and done["detail"] == "pd-p did not start"
        assert svc.topology.worker("pd-2").role == "pd-d"  # restored, at its new address
        assert svc.topology.worker("pd-2").kv_port == 998
        assert _names(svc, "decode") == {"pd-1", "pd-2"}
        assert svc.shape.controller.outcomes["failed"] == 1
        assert svc.shape.controller._last is None  # a change that did not happen: no hold
        # a restore that failed too (no pid): the instance is held down, not routed to
        await client.post("/shape/change", json={"instance": "pd-2", "role": "pd-p"})
        svc.shape.step()
        await client.post("/shape/switch", json={"instance": "pd-2"})
        await client.post("/shape/join", json={"instance": "pd-2", "ok": False,
                                               "detail": "restoring failed too", "pid": -1})
        assert not svc.membership.is_up("pd-2") and _names(svc, "decode") == {"pd-1"}
        svc.membership.observe("pd-2", 6)
        svc.membership.observe("pd-2", 6)  # its checks pass again: back
        assert _names(svc, "decode") == {"pd-1", "pd-2"}
        # a change nobody carries out: abandoned, the instance back in its old role
        monkeypatch.setattr(live_shape, "ABANDON_S", 0.0)
        await client.post("/shape/change", json={"instance": "pd-1", "role": "pd-p"})
        svc.shape.step()
        await asyncio.sleep(0.01)
        svc.shape.step()
        assert svc.shape.current is None
        assert svc.shape.history[-1]["detail"] == "no deployment took it up"
        assert _names(svc, "decode") == {"pd-1", "pd-2"}

    asyncio.run(_with_client(svc, body))


def test_the_live_router_and_the_simulator_feed_the_controller_alike() -> None:
    from prfaas.emulated.backend import emulated_plan_inputs  # noqa: F401 (layering: unused)
    from prfaas.policy.shape import ShapeController
    from prfaas.sim.shape import ShapePlugin

    svc = _service()
    assert svc.shape is not None
    sim_side = ShapePlugin(ShapeController(svc.shape.controller.inputs,
                                           svc.shape.controller.config))
    for k in range(30):
        query = RouteQuery(RequestInfo(str(k), 200 + 37 * k, 16, 0.5 * k),
                           {"pd-0": 64 * (k % 3), "pd-1": 32})
        decision = RouteDecision(Route.PD, "pd-0", "pd-1", 64 * (k % 3), 0)
        svc.shape.observe_route(query, decision)
        sim_side.on_decided(k, query, decision)
    rejected = RouteDecision.reject("full")
    svc.shape.observe_route(query, rejected)
    sim_side.on_decided(99, query, rejected)
    live_window = list(svc.shape.controller._window)
    assert live_window == list(sim_side.controller._window) and len(live_window) == 30
    assert any(s.saved_s > 0 for s in live_window)  # the reuse at pd-0 is in it


def test_a_shape_section_is_refused_where_no_deployment_can_change_roles() -> None:
    from prfaas.serve.deploy.launcher import Deployment

    with pytest.raises(ConfigError, match="--ray"):
        Deployment(topology(workers=FOUR, shape={}))
    with pytest.raises(ConfigError, match="TLS"):
        topology(workers=FOUR, shape={}, security={"tls": {"dir": "/nonexistent"}})
