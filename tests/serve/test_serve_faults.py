"""Failing transfers: the PrfaaS prefill worker is a test double that breaks the KV stream.

The double speaks the control protocol but, per mode, sends the decode worker a frame with a
bad checksum, hangs up in the middle of a frame, or never answers. The router must retry on
the local path (PD-P) and still return the exact `generate` tokens, within the timeouts, and
every worker must keep serving.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from serve_helpers import MODEL, complete, get_text, post, topology

from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.ports import free_port
from prfaas.transport.wire import DType, Kind, data_header

pytestmark = pytest.mark.timeout(600)
HANG_TIMEOUT_S = 4


class FaultyPrefill:
    """An aiohttp /prefill double on its own thread and event loop."""

    def __init__(self, port: int) -> None:
        self.port, self.mode, self.calls = port, "corrupt", 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._release = asyncio.Event()
        app = web.Application()
        app.add_routes([web.post("/prefill", self.prefill), web.get("/health", self.health)])
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)  # do not wait for "hang"
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._release.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def prefill(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        if self.mode == "hang":
            await asyncio.wait_for(self._release.wait(), 60)
        rid, dest = body["request_id"], body["dest"]
        payload = np.arange(256, dtype=np.float32).tobytes()
        header = data_header(rid, 0, Kind.LINEAR, "state", DType.FLOAT32, (64, 4),
                             len(payload), 0, memoryview(payload))
        with socket.create_connection((dest["host"], dest["port"]), timeout=5) as sock:
            if self.mode == "corrupt":  # the header announces a crc the payload does not have
                sock.sendall(header + bytes([payload[0] ^ 0xFF]) + payload[1:])
            else:  # "gone": half the payload, then hang up
                sock.sendall(header + payload[: len(payload) // 2])
            time.sleep(0.2)
        # a lying worker: it claims success, only the decode worker sees the broken stream
        return web.json_response({"first_token": 0, "cached_tokens": 0, "computed_tokens": 1,
                                  "kv_bytes": len(payload), "prefill_s": 0.0, "cache": {}})


@pytest.fixture(scope="module")
def faulty() -> Iterator[tuple[Deployment, FaultyPrefill]]:
    port = free_port()
    topo = topology(
        timeouts={"connect_s": 2, "prefill_s": HANG_TIMEOUT_S, "kv_s": 30, "token_s": 30},
        workers=[{"name": "prfaas-0", "role": "prfaas", "port": port},
                 {"name": "pdp-0", "role": "pd-p"}, {"name": "pdd-0", "role": "pd-d"}])
    double = FaultyPrefill(port)
    double.start()
    try:
        with Deployment(topo, external=frozenset({"prfaas-0"})) as dep:
            yield dep, double
    finally:
        double.stop()


LONG = "A long prompt that the PrfaaS cluster should prefill. " * 10


@pytest.mark.parametrize("mode", ["corrupt", "gone", "hang"])
def test_failed_transfer_is_retried_locally(faulty: tuple[Deployment, FaultyPrefill],
                                            engine: Any, mode: str) -> None:
    dep, double = faulty
    double.mode, calls = mode, double.calls
    failed_before = _failed_transfers(dep)
    prompt = f"[{mode}] {LONG}"  # unseen: no local cache hit may turn it into a PD route
    t0 = time.monotonic()
    reply = complete(dep.url, prompt, max_tokens=5)
    elapsed_s = time.monotonic() - t0
    assert double.calls == calls + 1  # the PrfaaS route was tried first
    p = reply["prfaas"]
    assert p["retried"] and p["route"] == "pd" and p["prefill_node"] == "pdp-0", p
    assert p["retry_reason"]
    assert p["token_ids"] == engine.generate(engine.tokenizer.encode(prompt), 5)
    assert elapsed_s < HANG_TIMEOUT_S + 60  # bounded by the timeouts, never hung (+ load)
    assert all(dep.alive().values())
    # the decode worker saw the broken stream (a hung prefill sends nothing to fail on)
    assert _failed_transfers(dep) == failed_before + (0 if mode == "hang" else 1)


def _failed_transfers(dep: Deployment) -> int:
    status = json.loads(get_text(f"{dep.topology.worker('pdd-0').url}/status"))
    return int(status["failed_transfers"])


def test_workers_still_serve_after_faults(faulty: tuple[Deployment, FaultyPrefill]) -> None:
    dep, _ = faulty
    short = complete(dep.url, "still alive?", max_tokens=3)
    assert short["prfaas"]["route"] == "pd" and not short["prfaas"]["retried"]
    retries = re.search(r"^prfaas_retries_total (\S+)$", get_text(f"{dep.url}/metrics"), re.M)
    assert retries is not None and float(retries.group(1)) >= 1  # the faults above retried


def test_no_retry_left_is_a_clear_502() -> None:
    """With retries off and the only prefill path broken, the client gets a 502 error object
    naming the failure, quickly."""
    port = free_port()  # nothing listens here: the prefill worker is gone
    topo = topology(max_retries=0, policy={"name": "all-prfaas"},
                    timeouts={"connect_s": 2, "prefill_s": 5, "kv_s": 10, "token_s": 10},
                    workers=[{"name": "prfaas-0", "role": "prfaas", "port": port},
                             {"name": "pdd-0", "role": "pd-d"}])
    with Deployment(topo, external=frozenset({"prfaas-0"})) as dep:
        t0 = time.monotonic()
        status, reply = post(f"{dep.url}/v1/completions",
                             {"model": MODEL, "prompt": LONG, "max_tokens": 3})
        assert status == 502 and time.monotonic() - t0 < 60
        assert reply["error"]["code"] == "transfer_failed"
        assert "prfaas-0" in reply["error"]["message"]
        assert all(dep.alive().values())
