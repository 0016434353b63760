"""The link meter (serve/link_meter.py): delivered bytes per destination read from its
interface's counter, held against its budget; and the gateway's use of it (a real counter: the
loopback interface, which the test's own traffic crosses) and of its in-flight count."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prfaas.core.errors import ConfigError
from prfaas.models.profile import KVSize, PrefillTime
from prfaas.serve.gateway import Gateway, GatewayConfig, TenantSpec
from prfaas.serve.link_meter import LinkMeter, tx_bytes

GB = 1e9 / 8  # bytes in one gigabit
KEYS = {"near": "near-key-0123", "far": "far-key-45678"}


def test_meter_rates_and_intervals_over_budget() -> None:
    counters = {"a": 1000, "b": 0}
    m = LinkMeter({"near": "a", "far": "b"}, {"near": 2.0, "far": 100.0}, 0.0,
                  read=lambda i: counters[i])
    for t, (near_gb, far_gb) in enumerate([(1.0, 1.0), (3.0, 3.0), (1.5, 0.0)], start=1):
        counters["a"] += int(near_gb * GB)
        counters["b"] += int(far_gb * GB)
        m.sample(float(t))
    snap = m.snapshot()
    near, far = snap["near"], snap["far"]
    assert near["link_bytes"] == int(1.0 * GB) + int(3.0 * GB) + int(1.5 * GB)
    assert near["link_gbps"] == pytest.approx(1.5, rel=1e-6)
    assert near["link_gbps_max"] == pytest.approx(3.0, rel=1e-6)
    assert near["intervals"] == 3 and near["over_budget_intervals"] == 1  # the 3 Gbps second
    assert far["over_budget_intervals"] == 0  # the control: the same traffic, a high budget


def test_an_interface_that_cannot_be_read_fails_at_once() -> None:
    with pytest.raises(ConfigError, match="no-such-if0"):
        tx_bytes("no-such-if0")
    assert tx_bytes("lo") >= 0


async def _worker(tail_s: float) -> tuple[web.AppRunner, str]:
    async def prefill(request: web.Request) -> web.StreamResponse:
        await request.json()
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"event": "computed"}\n')
        await resp.write(b" " * 200_000)  # bytes over loopback, as a KV tail would be
        await asyncio.sleep(tail_s)
        await resp.write(b'\n{"kv_bytes": 1000}\n')
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.add_routes([web.post("/prefill", prefill), web.get("/health", health)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore


def test_gateway_meters_a_named_link_and_counts_transfers_in_flight() -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any], str]:
        wrunner, wurl = await _worker(tail_s=0.6)
        tenants = (TenantSpec("near", "KEY_near", 1.0, 100.0, link_interface="lo"),
                   TenantSpec("far", "KEY_far", 1.0, 100.0))
        config = GatewayConfig(tenants, (wurl,), PrefillTime(0.0, 1e-3, 0.0, "test"),
                               KVSize(0.0, 1000.0, None, "test"), "drr", meter_interval_s=0.1)
        gw = Gateway(config, KEYS)
        runner = web.AppRunner(gw.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        gurl = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore
        try:
            async with aiohttp.ClientSession() as s:
                while True:
                    async with s.get(f"{gurl}/health") as r:
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.05)
                body = {"request_id": 1, "token_ids": [1] * 10, "ship_from_tokens": 0}
                job = asyncio.create_task(s.post(f"{gurl}/prefill", json=body, headers={
                    "Authorization": f"Bearer {KEYS['near']}"}))
                await asyncio.sleep(0.3)  # computed; the tail still crosses
                async with s.get(f"{gurl}/status") as r:
                    during = await r.json()
                (await job).release()
                await asyncio.sleep(0.25)  # a meter interval after the end
                async with s.get(f"{gurl}/status") as r:
                    after = await r.json()
                async with s.get(f"{gurl}/metrics") as r:
                    metrics = await r.text()
        finally:
            await runner.cleanup()
            await wrunner.cleanup()
        return during, after, metrics

    during, after, metrics = asyncio.run(go())
    assert during["tenants"]["near"]["transferring"] == 1
    assert after["tenants"]["near"]["transferring"] == 0  # the control: the tail is over
    link = after["tenants"]["near"]["link"]
    assert link["interface"] == "lo" and link["link_bytes"] >= 200_000 and link["intervals"] >= 3
    assert "link" not in after["tenants"]["far"]  # no interface named: not metered
    assert 'prfaas_destination_link_bytes_total{destination="near"}' in metrics
    assert 'destination="far"' not in metrics.split("prfaas_destination_link_bytes_total")[-1]
