"""The PrfaaS tenant gateway (serve/gateway.py) in process, in front of fake prefill workers
that speak the progress protocol: tenant keys, the share policy's order, the egress budget,
the early release of the engine and the per-tenant / per-destination metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prfaas.models.profile import KVSize, PrefillTime
from prfaas.serve.gateway import Gateway, GatewayConfig, TenantSpec

KEYS = {"near": "near-key-0123", "far": "far-key-45678"}


class FakeWorker:
    """One engine: jobs compute one at a time (`compute_s`), then a tail (`tail_s`)."""

    def __init__(self, compute_s: float = 0.05, tail_s: float = 0.0,
                 order: list[int] | None = None) -> None:
        self.compute_s, self.tail_s = compute_s, tail_s
        self.order: list[int] = [] if order is None else order  # compute starts
        self.lock = asyncio.Lock()
        self.concurrent_compute = 0
        self.max_concurrent_compute = 0

    async def prefill(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body.get("progress") is True
        async with self.lock:
            self.concurrent_compute += 1
            self.max_concurrent_compute = max(self.max_concurrent_compute,
                                              self.concurrent_compute)
            self.order.append(body["request_id"])
            await asyncio.sleep(self.compute_s)
            self.concurrent_compute -= 1
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"event": "computed"}\n')
        await asyncio.sleep(self.tail_s)
        await resp.write(b'{"kv_bytes": 1000, "computed_tokens": %d}\n'
                         % len(body["token_ids"]))
        await resp.write_eof()
        return resp

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _config(urls: list[str], policy: str, budget: dict[str, float] | None = None,
            weights: dict[str, float] | None = None) -> GatewayConfig:
    budget = budget or {"near": 100.0, "far": 100.0}
    weights = weights or {"near": 1.0, "far": 1.0}
    tenants = tuple(TenantSpec(t, f"KEY_{t}", weights[t], budget[t]) for t in ("near", "far"))
    # 1 s per 1000 tokens, 1 MB per 1000 tokens: a job of l tokens emits 8e-3 Gbps
    return GatewayConfig(tenants, tuple(urls), PrefillTime(0.0, 1e-3, 0.0, "test"),
                         KVSize(0.0, 1000.0, None, "test"), policy, quantum_tokens=1000.0)


async def _run(config_of: Any, jobs: list[tuple[str, int, int]], workers: list[FakeWorker],
               gap_s: float = 0.01) -> tuple[dict[str, Any], str, list[int]]:
    """Send `jobs` (tenant, request_id, tokens) in list order, `gap_s` apart, while the first
    occupy the workers; returns the gateway's status, metrics and the reply codes."""
    runners = []
    for w in workers:
        wapp = web.Application()
        wapp.add_routes([web.post("/prefill", w.prefill), web.get("/health", w.health)])
        runners.append(await _serve(wapp))
    gw = Gateway(config_of([u for _, u in runners]), KEYS)
    grunner, gurl = await _serve(gw.app())
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                async with s.get(f"{gurl}/health") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)

            async def one(tenant: str, rid: int, tokens: int) -> int:
                body = {"request_id": rid, "token_ids": [1] * tokens, "ship_from_tokens": 0,
                        "dest": {"host": "127.0.0.1", "port": 1}}
                async with s.post(f"{gurl}/prefill", json=body,
                                  headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as r:
                    await r.read()
                    return r.status

            tasks = []
            for tenant, rid, tokens in jobs:
                tasks.append(asyncio.create_task(one(tenant, rid, tokens)))
                await asyncio.sleep(gap_s)  # arrival order = list order
            codes = await asyncio.gather(*tasks)
            async with s.get(f"{gurl}/status") as r:
                status = await r.json()
            async with s.get(f"{gurl}/metrics") as r:
                metrics = await r.text()
    finally:
        await grunner.cleanup()
        for runner, _ in runners:
            await runner.cleanup()
    return status, metrics, list(codes)


# the hog's five jobs queue first, then the victim's one (request 100)
JOBS = [("far", i, 1000) for i in range(6)] + [("near", 100, 1000)]


def test_drr_lets_the_light_tenant_past_a_backlog_and_fcfs_does_not() -> None:
    drr: list[int] = []
    fcfs: list[int] = []
    status, metrics, codes = asyncio.run(
        _run(lambda u: _config(u, "drr"), JOBS, [FakeWorker(0.1, order=drr)]))
    asyncio.run(_run(lambda u: _config(u, "fcfs"), JOBS, [FakeWorker(0.1, order=fcfs)]))
    assert codes == [200] * len(JOBS)
    # FCFS (the negative control) runs the victim last; DRR within the hog's first jobs
    assert fcfs.index(100) == len(JOBS) - 1
    assert drr.index(100) <= 2
    assert status["tenants"]["far"]["ok"] == 6 and status["tenants"]["near"]["ok"] == 1
    assert status["tenants"]["near"]["uncached_tokens"] == 1000
    assert 'prfaas_tenant_requests_total{outcome="ok",tenant="near"} 1.0' in metrics
    assert 'prfaas_destination_kv_bytes_total{destination="far"} 6000.0' in metrics


def test_egress_budget_holds_a_destination_back() -> None:
    """Two engines. far's budget (0.01 Gbps) holds one of its 8e-3 Gbps prefills at a time,
    so the second engine goes to near's job although far's were queued first; without the
    budget (the control) both engines take far's jobs first."""
    jobs = [("far", 0, 1000), ("far", 1, 1000), ("far", 2, 1000), ("near", 100, 1000)]

    def order(budget_far: float) -> tuple[list[int], dict[str, Any]]:
        log: list[int] = []
        status, _, codes = asyncio.run(_run(
            lambda u: _config(u, "fcfs", {"near": 100.0, "far": budget_far}), jobs,
            [FakeWorker(0.3, order=log), FakeWorker(0.3, order=log)], gap_s=0.03))
        assert codes == [200] * len(jobs)
        return log, status

    held, status = order(0.01)
    free, _ = order(100.0)
    assert held.index(100) == 1  # near's job on the second engine
    assert status["tenants"]["far"]["budget_held"] >= 1
    assert free.index(100) == 3  # the control: FCFS order, no budget in the way


def test_engine_released_at_compute_end_not_after_the_tail() -> None:
    """A long KV tail (1 s) does not hold the engine: the next job starts after the compute;
    total time well under jobs x (compute + tail)."""
    async def go() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _run(lambda u: _config(u, "drr"), [("near", i, 1000) for i in range(3)],
                   [FakeWorker(compute_s=0.05, tail_s=1.0)])
        return loop.time() - t0

    assert asyncio.run(go()) < 2.5  # released after the tail: >= 3 x 1.05 s


@pytest.mark.parametrize("header", [None, "Bearer wrong-key-0000", f"Bearer {KEYS['near']}x"])
def test_a_prefill_without_its_tenant_key_is_refused(header: str | None) -> None:
    async def go() -> tuple[int, str]:
        worker = FakeWorker()
        wapp = web.Application()
        wapp.add_routes([web.post("/prefill", worker.prefill),
                         web.get("/health", worker.health)])
        wrunner, wurl = await _serve(wapp)
        gw = Gateway(_config([wurl], "drr"), KEYS)
        grunner, gurl = await _serve(gw.app())
        try:
            async with aiohttp.ClientSession() as s:
                headers = {"Authorization": header} if header else {}
                async with s.post(f"{gurl}/prefill", json={"request_id": 1, "token_ids": [1]},
                                  headers=headers) as r:
                    code = r.status
                async with s.get(f"{gurl}/metrics") as r:
                    return code, await r.text()
        finally:
            await grunner.cleanup()
            await wrunner.cleanup()

    code, metrics = asyncio.run(go())
    assert code == 401
    assert "prfaas_gateway_unauthorized_total 1.0" in metrics
