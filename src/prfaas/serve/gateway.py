"""The PrfaaS cluster's front door when it serves several PD clusters (issue 22): tenants, a fair
share of the prefill workers and a KV egress budget per destination.

Each PD cluster is a tenant: its router sends its PrfaaS prefills (`POST /prefill`, the prefill
worker's own protocol, serve/worker/prefill_worker.py) here with `Authorization: Bearer KEY`,
its tenant key (the router reads it from PRFAAS_TENANT_KEY; serve/router/backends/native.py).
A missing or unknown key is 401 (compared in constant time, security/apikey.py). A tenant is
also a destination: its KV goes to its own decoders over its own link.

Scheduling: the same objects the multi-cluster simulator calls (sim/regions.py):
- jobs wait in a `SharePolicy` (policy/fair_share.py: deficit round robin on uncached tokens,
  weighted per tenant, or FCFS as the negative control);
- when a worker's engine is free, `pick(blocked)` chooses the next job, `blocked` naming the
  destinations whose `EgressBudget` (policy/region_control.py) could not take one more prefill
  at the highest KV rate one prefill emits, exactly the simulator's `_blocked` rule. A running
  prefill counts against its destination's budget at S_kv(l) / T_prefill(l) (Eq. 1, the
  PrfaaS profile) from its start to the end of its compute, as in the simulator.
The worker is asked for a progress reply (`progress: true`): its first line says the compute is
done, and the gateway hands the engine its next job at once while the KV tail still crosses
(the engine and the link overlap as in the simulator). The final line goes back to the router
with the worker's status.

`/metrics` (Prometheus text): per tenant requests by outcome, queued and running, uncached
tokens started, queue seconds; per destination KV bytes delivered (as the workers report them),
running KV rate, budget and how often the budget held a destination back; and, for a tenant
whose `link_interface` is given, the bytes its link really carried, metered at that interface
(serve/link_meter.py: total, the last interval's rate, intervals over the budget). `/status`:
the same as JSON, with each destination's prefills computing (`running`) and those whose
compute is done but whose KV tail still crosses (`transferring`): what a cut of its link
catches in flight.

`python -m prfaas.serve.gateway --config FILE` (JSON, `GatewayConfig.to_json`); keys come from
the environment variables the config names, never from the file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from prfaas.core.errors import ConfigError
from prfaas.models.profile import KVSize, PrefillTime
from prfaas.policy.fair_share import SharePolicy, make_share_policy
from prfaas.policy.region_control import EgressBudget, blocked_destinations, max_kv_gbps
from prfaas.security.apikey import bearer_ok, check_key
from prfaas.serve.link_meter import LinkMeter
from prfaas.serve.prom import Counter


@dataclass(frozen=True)
class TenantSpec:
    name: str
    key_env: str  # the environment variable holding its key
    weight: float  # DRR weight
    budget_gbps: float  # its destination's egress budget (live Gbps)
    link_interface: str | None = None  # its link's interface here: delivered bytes read there


@dataclass(frozen=True)
class GatewayConfig:
    tenants: tuple[TenantSpec, ...]
    workers: tuple[str, ...]  # prefill worker URLs
    prefill: PrefillTime  # the PrfaaS workers' profile (live units)
    kv: KVSize  # live units
    share_policy: str = "drr"
    quantum_tokens: float = 8192.0
    host: str = "0.0.0.0"
    port: int = 0
    request_timeout_s: float = 900.0
    meter_interval_s: float = 1.0  # how often the links' byte counters are read

    def to_json(self) -> dict[str, Any]:
        p, k = self.prefill, self.kv
        return {"tenants": [vars(t) for t in self.tenants], "workers": list(self.workers),
                "prefill": {"c2": p.c2, "c1": p.c1, "c0": p.c0},
                "kv": {"fixed_bytes": k.fixed_bytes, "per_token_bytes": k.per_token_bytes},
                "share_policy": self.share_policy, "quantum_tokens": self.quantum_tokens,
                "host": self.host, "port": self.port,
                "request_timeout_s": self.request_timeout_s,
                "meter_interval_s": self.meter_interval_s}

    @staticmethod
    def from_json(raw: dict[str, Any]) -> GatewayConfig:
        try:
            tenants = tuple(TenantSpec(str(t["name"]), str(t["key_env"]), float(t["weight"]),
                                       float(t["budget_gbps"]),
                                       None if t.get("link_interface") is None
                                       else str(t["link_interface"]))
                            for t in raw["tenants"])
            p, k = raw["prefill"], raw["kv"]
            return GatewayConfig(
                tenants, tuple(str(w) for w in raw["workers"]),
                PrefillTime(float(p["c2"]), float(p["c1"]), float(p["c0"]), "gateway config"),
                KVSize(float(k["fixed_bytes"]), float(k["per_token_bytes"]), None,
                       "gateway config"),
                str(raw.get("share_policy", "drr")), float(raw.get("quantum_tokens", 8192.0)),
                str(raw.get("host", "0.0.0.0")), int(raw.get("port", 0)),
                float(raw.get("request_timeout_s", 900.0)),
                float(raw.get("meter_interval_s", 1.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError("gateway config", type(exc).__name__, str(exc)) from exc


@dataclass
class _Job:
    body: dict[str, Any]
    tenant: str
    tokens: int
    cost_tokens: float
    queued_at: float
    granted: asyncio.Future[str]  # the worker URL it runs on


class _Metrics:
    def __init__(self) -> None:
        self.requests = Counter("prfaas_tenant_requests_total",
                                "PrfaaS prefills per tenant and outcome")
        self.tokens = Counter("prfaas_tenant_uncached_tokens_total",
                              "uncached tokens of the prefills started per tenant")
        self.queue_s = Counter("prfaas_tenant_queue_seconds_total",
                               "seconds the started prefills waited in the share policy")
        self.queued = Counter("prfaas_tenant_queued", "prefills waiting per tenant", "gauge")
        self.running = Counter("prfaas_tenant_running", "prefills computing per tenant",
                               "gauge")
        self.kv_bytes = Counter("prfaas_destination_kv_bytes_total",
                                "KV bytes delivered per destination")
        self.kv_gbps = Counter("prfaas_destination_running_kv_gbps",
                               "KV rate of the running prefills per destination (Eq. 1)",
                               "gauge")
        self.budget = Counter("prfaas_destination_egress_budget_gbps",
                              "egress budget per destination", "gauge")
        self.held = Counter("prfaas_destination_budget_held_total",
                            "picks at which the egress budget held the destination back")
        self.unauthorized = Counter("prfaas_gateway_unauthorized_total",
                                    "prefills refused for a missing or unknown tenant key")
        self.transferring = Counter("prfaas_destination_transferring",
                                    "prefills computed whose KV tail still crosses", "gauge")
        self.link_bytes = Counter("prfaas_destination_link_bytes_total",
                                  "bytes the destination's link carried, read at its interface")
        self.link_gbps = Counter("prfaas_destination_link_gbps",
                                 "the destination link's rate over the last meter interval",
                                 "gauge")
        self.over_budget = Counter("prfaas_destination_link_over_budget_intervals_total",
                                   "meter intervals in which the link carried more than the "
                                   "destination's egress budget")

    def render(self) -> str:
        out: list[str] = []
        for c in (self.requests, self.tokens, self.queue_s, self.queued, self.running,
                  self.kv_bytes, self.kv_gbps, self.budget, self.held, self.unauthorized,
                  self.transferring, self.link_bytes, self.link_gbps, self.over_budget):
            out += c.render()
        return "\n".join(out) + "\n"


class Gateway:
    def __init__(self, config: GatewayConfig, keys: dict[str, str]) -> None:
        """`keys`: tenant name -> its key."""
        self.config = config
        self.keys = {t.name: check_key(keys[t.name], t.key_env) for t in config.tenants}
        weights = {t.name: t.weight for t in config.tenants}
        self.share: SharePolicy[_Job] = make_share_policy(config.share_policy, weights,
                                                          config.quantum_tokens)
        self.budgets = {t.name: EgressBudget(t.budget_gbps) for t in config.tenants}
        self.running = dict.fromkeys(weights, 0)
        self.transferring = dict.fromkeys(weights, 0)
        self.running_gbps = dict.fromkeys(weights, 0.0)
        # a named interface that cannot be read fails here, before the gateway serves
        self.meter = LinkMeter({t.name: t.link_interface for t in config.tenants
                                if t.link_interface},
                               {t.name: t.budget_gbps for t in config.tenants},
                               time.monotonic())
        self._metering: asyncio.Task[None] | None = None
        self.phi_max_gbps = max_kv_gbps(config.prefill, config.kv)
        self.free: deque[str] = deque(config.workers)
        self.metrics = _Metrics()
        for t in config.tenants:
            self.metrics.budget.set(t.budget_gbps, destination=t.name)
        self._session: aiohttp.ClientSession | None = None
        self._waiting: asyncio.Task[None] | None = None
        self.ready = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.get("/health", self.health), web.get("/status", self.status),
                        web.get("/metrics", self.metrics_page),
                        web.post("/prefill", self.prefill)])
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._waiting = asyncio.create_task(self._await_workers())
        if self.meter.lines:
            self._metering = asyncio.create_task(self._meter())

    async def _meter(self) -> None:
        while True:
            await asyncio.sleep(self.config.meter_interval_s)
            self._read_links()

    def _read_links(self) -> None:
        self.meter.sample(time.monotonic())
        m = self.metrics
        for dest, line in self.meter.snapshot().items():
            m.link_bytes.set(float(line["link_bytes"]), destination=dest)
            m.link_gbps.set(line["link_gbps"], destination=dest)
            m.over_budget.set(float(line["over_budget_intervals"]), destination=dest)

    async def _await_workers(self) -> None:
        """Ready once every prefill worker answers /health (they run beside the gateway,
        e.g. inside the PrfaaS namespace where only the gateway reaches them)."""
        assert self._session is not None
        pending = set(self.config.workers)
        while pending:
            for url in list(pending):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self._session.get(f"{url}/health",
                                                 timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            pending.discard(url)
            if pending:
                await asyncio.sleep(0.2)
        self.ready = True

    async def _close(self, _: web.Application) -> None:
        for task in (self._waiting, self._metering):
            if task is not None:
                task.cancel()
        if self._session is not None:
            await self._session.close()

    async def health(self, _: web.Request) -> web.Response:
        if not self.ready:
            return web.json_response({"ok": False, "waiting_for": "prefill workers"},
                                     status=503)
        return web.json_response({"ok": True, "name": "prfaas-gateway", "role": "prfaas",
                                  "pid": os.getpid()})

    async def metrics_page(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain")

    async def status(self, _: web.Request) -> web.Response:
        m = self.metrics
        links = self.meter.snapshot()
        return web.json_response({
            "share_policy": self.config.share_policy, "free_workers": len(self.free),
            "workers": len(self.config.workers),
            "tenants": {t: {"queued": self.share.queued(t), "running": self.running[t],
                            "running_kv_gbps": self.running_gbps[t],
                            "budget_gbps": self.budgets[t].budget_gbps,
                            "ok": m.requests.get(tenant=t, outcome="ok"),
                            "failed": m.requests.get(tenant=t, outcome="failed"),
                            "uncached_tokens": m.tokens.get(tenant=t),
                            "queue_s": m.queue_s.get(tenant=t),
                            "kv_bytes": m.kv_bytes.get(destination=t),
                            "budget_held": m.held.get(destination=t),
                            "transferring": self.transferring[t],
                            **({"link": links[t]} if t in links else {})}
                        for t in self.running},
            "monotonic_s": time.monotonic()})

    def _tenant(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization")
        found = None
        for name, key in self.keys.items():  # every key compared: the time says nothing
            if bearer_ok(header, key):
                found = name
        return found

    async def prefill(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        if tenant is None:
            self.metrics.unauthorized.inc()
            return _error(401, "unauthorized", "a PrfaaS prefill needs its tenant's key "
                          "(Authorization: Bearer KEY)")
        try:
            body = await request.json()
            tokens = len(body["token_ids"])
            ship_from = int(body.get("ship_from_tokens", 0))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "bad_request", f"body: {type(exc).__name__}: {exc}")
        loop = asyncio.get_running_loop()
        job = _Job({**body, "progress": True}, tenant, tokens, float(max(tokens - ship_from, 0)),
                   time.monotonic(), loop.create_future())
        self.share.push(tenant, job, job.cost_tokens)
        self.metrics.queued.set(self.share.queued(tenant), tenant=tenant)
        self._dispatch()
        url = await job.granted  # (a handler cancelled here leaves its job to be skipped)
        return await self._forward(job, url)

    def _job_gbps(self, tokens: int) -> float:
        t = float(self.config.prefill.time_s(float(tokens)))
        return float(self.config.kv.size_bytes(float(tokens))) * 8 / 1e9 / max(t, 1e-9)

    def _blocked(self) -> set[str]:
        """The simulator's rule (policy/region_control.py `blocked_destinations`): a
        destination whose budget could not take one more prefill at the highest KV rate."""
        return blocked_destinations(self.budgets, self.running_gbps, self.running,
                                    self.phi_max_gbps)

    def _dispatch(self) -> None:
        while self.free:
            blocked = self._blocked()
            for t in blocked:
                if self.share.queued(t):
                    self.metrics.held.inc(destination=t)
            picked = self.share.pick(blocked)
            if picked is None:
                return
            tenant, job = picked
            if job.granted.done():  # its caller is gone
                self.metrics.queued.set(self.share.queued(tenant), tenant=tenant)
                continue
            url = self.free.popleft()
            gbps = self._job_gbps(job.tokens)
            self.running[tenant] += 1
            self.running_gbps[tenant] += gbps
            m = self.metrics
            m.queued.set(self.share.queued(tenant), tenant=tenant)
            m.running.set(self.running[tenant], tenant=tenant)
            m.kv_gbps.set(self.running_gbps[tenant], destination=tenant)
            m.tokens.inc(job.cost_tokens, tenant=tenant)
            m.queue_s.inc(time.monotonic() - job.queued_at, tenant=tenant)
            job.body["_gbps"] = gbps
            job.granted.set_result(url)

    def _release(self, job: _Job, url: str) -> None:
        gbps = float(job.body.pop("_gbps", 0.0))
        self.running[job.tenant] -= 1
        self.running_gbps[job.tenant] = max(self.running_gbps[job.tenant] - gbps, 0.0)
        self.metrics.running.set(self.running[job.tenant], tenant=job.tenant)
        self.metrics.kv_gbps.set(self.running_gbps[job.tenant], destination=job.tenant)
        self.free.append(url)
        self._dispatch()

    def _transfer(self, tenant: str, delta: int) -> None:
        self.transferring[tenant] += delta
        self.metrics.transferring.set(self.transferring[tenant], destination=tenant)

    async def _forward(self, job: _Job, url: str) -> web.Response:
        assert self._session is not None
        released = False
        body = {k: v for k, v in job.body.items() if k != "_gbps"}
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
        try:
            async with self._session.post(f"{url}/prefill", json=body,
                                          timeout=timeout) as resp:
                if resp.status != 200:  # refused before computing (e.g. 400)
                    text = await resp.text()
                    self._release(job, url)
                    released = True
                    self.metrics.requests.inc(tenant=job.tenant, outcome="failed")
                    return web.Response(status=resp.status, text=text,
                                        content_type="application/json")
                first = json.loads(await resp.content.readline() or b"{}")
                if first.get("event") == "computed":
                    self._release(job, url)
                    released = True
                    self._transfer(job.tenant, +1)
                    try:
                        line = await resp.content.readline()
                    finally:
                        self._transfer(job.tenant, -1)
                else:
                    line = json.dumps(first).encode()
                reply = json.loads(line or b"{}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.metrics.requests.inc(tenant=job.tenant, outcome="failed")
            return _error(502, "gateway", f"prefill worker {url}: {type(exc).__name__}: {exc}")
        finally:
            if not released:
                self._release(job, url)
        status = int(reply.pop("status", 200)) if isinstance(reply, dict) else 502
        ok = status == 200
        self.metrics.requests.inc(tenant=job.tenant, outcome="ok" if ok else "failed")
        if ok:
            self.metrics.kv_bytes.inc(float(reply.get("kv_bytes", 0)), destination=job.tenant)
        return web.json_response(reply, status=status)


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="GatewayConfig as JSON")
    args = parser.parse_args(argv)
    config = GatewayConfig.from_json(json.loads(Path(args.config).read_text()))
    missing = [t.key_env for t in config.tenants if not os.environ.get(t.key_env)]
    if missing:
        print(f"gateway: no tenant key in {missing[0]}", file=sys.stderr)
        return 2
    gw = Gateway(config, {t.name: os.environ[t.key_env] for t in config.tenants})
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(gw.app(), host=config.host, port=config.port, print=None,
                    handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
