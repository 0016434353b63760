"""In-process pieces of resilience: the topology keys, membership transitions, the view the
policy sees, the supervisor's backoff, and the dispatcher's retry/resume driven by a scripted
backend (no workers, no sockets)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from serve_helpers import MODEL, topology

from prfaas.core.errors import ConfigError
from prfaas.engine import ByteTokenizer
from prfaas.serve.deploy.supervisor import Supervisor
from prfaas.serve.ports import free_port
from prfaas.serve.resilience import RestartSpec
from prfaas.serve.router.backends import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
    make_backend,
)
from prfaas.serve.router.dispatch import Dispatcher, Outcome
from prfaas.serve.router.failover import guarded
from prfaas.serve.router.openai_api import ApiError, parse
from prfaas.serve.router.service import RouterService
from prfaas.serve.topology import WorkerSpec
from prfaas.serve.worker.protocol import error_reply

TOK = ByteTokenizer()
FOUR = [{"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
        {"name": "pdd-0", "role": "pd-d"}, {"name": "pdd-1", "role": "pd-d"}]


@pytest.mark.parametrize(("raw", "field"), [
    ({"health": {"interval_s": 0}}, "health.interval_s"),
    ({"health": {"failures_before_down": 0}}, "health.failures_before_down"),
    ({"health": {"failures_before_down": 1.5}}, "health.failures_before_down"),
    ({"health": {"bogus": 1}}, "health"),
    ({"health": {"timeout_s": "fast"}}, "health.timeout_s"),
    ({"restart": {"initial_backoff_s": 2, "max_backoff_s": 1}}, "restart.max_backoff_s"),
    ({"kv_deadline": {"multiplier": 0.5}}, "kv_deadline.multiplier"),
    ({"admission": {"max_inflight": 0}}, "admission.max_inflight"),
])
def test_resilience_keys_are_validated(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        topology(**raw)
    assert info.value.field == field


def test_resilience_keys_round_trip(tmp_path: Path) -> None:
    from prfaas.serve.topology import load_topology

    topo = topology(health={"interval_s": 0.2, "failures_before_down": 4},
                    restart={"max_backoff_s": 3}, kv_deadline={"floor_s": 1.5})
    assert topo.health.interval_s == 0.2 and topo.health.failures_before_down == 4
    assert topo.health.successes_before_up == 2  # default kept
    topo.dump(tmp_path / "t.yaml")
    again = load_topology(tmp_path / "t.yaml")
    assert (again.health, again.restart, again.kv_deadline) == (
        topo.health, topo.restart, topo.kv_deadline)


def _service(**overrides: Any) -> RouterService:
    return RouterService(topology(workers=FOUR, **overrides))


def test_membership_down_up_restart_and_the_policy_view() -> None:
    async def run() -> None:
        svc = _service(health={"failures_before_down": 2, "successes_before_up": 2})
        m = svc.membership
        ev = m.down_event("pdd-0")
        m.observe("pdd-0", 100)
        m.observe("pdd-0", None, "ConnectionRefused")
        assert m.is_up("pdd-0") and not ev.is_set()  # one failure is not enough
        m.observe("pdd-0", None, "ConnectionRefused")
        assert not m.is_up("pdd-0") and ev.is_set() and m.degraded
        names = {i.instance_id for i in svc.cluster.view().instances(role="decode")}
        assert names == {"pdd-1"}  # the policy never sees a down worker
        svc.manager.on_insert("pdd-0", [11, 12], [12])
        svc.manager.on_insert("pdd-1", [11], [11])
        m.observe("pdd-0", 101)
        assert not m.is_up("pdd-0")  # one success is not enough
        match = svc.manager.match([11, 12])  # the restarted worker's cache is forgotten
        assert match.cached_tokens("pdd-0") == 0 and match.cached_tokens("pdd-1") > 0
        m.observe("pdd-0", 101)
        assert m.is_up("pdd-0") and not m.degraded and m.states["pdd-0"].restarts == 1
        assert not m.down_event("pdd-0").is_set()  # a fresh event for the next outage
        up_ev = m.down_event("pdd-1")
        m.observe("pdd-1", 7)
        m.observe("pdd-1", 8)  # restarted between two checks: stays up, watchers fire
        assert m.is_up("pdd-1") and up_ev.is_set() and m.states["pdd-1"].restarts == 1
        m.suspect("prfaas-0", "connection refused")  # passive: down at once
        assert not m.is_up("prfaas-0")
        assert svc.cluster.view().instances(cluster="prfaas") == []
        text = svc.metrics.render(svc._refresh_gauges)
        assert 'prfaas_worker_up{worker="prfaas-0"} 0.0' in text
        assert 'prfaas_worker_up{worker="pdd-0"} 1.0' in text
        assert "prfaas_degraded 1.0" in text
        assert 'prfaas_worker_restarts_total{worker="pdd-0"} 1.0' in text

    asyncio.run(run())


def test_supervisor_restarts_with_doubling_backoff_to_the_cap() -> None:
    spawned: list[float] = []

    def spawn(name: str, append: bool) -> Any:
        import subprocess

        spawned.append(time.monotonic())
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])

    logs: list[str] = []
    sup = Supervisor(spawn, RestartSpec(initial_backoff_s=0.2, max_backoff_s=0.4), logs.append)
    sup.add("w", spawn("w", False))
    sup.start()
    deadline = time.monotonic() + 60
    while sup.restarts["w"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    sup.stop()
    assert sup.restarts["w"] >= 4
    gaps = [b - a for a, b in itertools.pairwise(spawned)][:4]
    assert 0.2 <= gaps[0] < gaps[1]  # 0.2 s, then 0.4 s ...
    assert all(g >= 0.4 for g in gaps[1:])  # ... capped at 0.4 s
    assert any("exited with code 3" in line for line in logs)
    assert any("restart 1" in line for line in logs)
    count = sup.restarts["w"]
    time.sleep(0.5)
    assert sup.restarts["w"] == count  # stopped: no restart after stop()


class Scripted(WorkerBackend):
    """Per attempt: emit the engine's greedy tokens; attempt i fails after `fail_after[i]` of
    them, blaming its prefill worker (i = 0) or its decoder."""

    def __init__(self, engine: Any, fail_after: list[int | None]) -> None:
        self.engine, self.fail_after = engine, fail_after
        self.attempts: list[Attempt] = []

    async def run(self, attempt: Attempt, report: AttemptReport) -> AsyncIterator[TokenEvent]:
        i = len(self.attempts)
        self.attempts.append(attempt)
        limit = self.fail_after[i] if i < len(self.fail_after) else None
        tokens = self.engine.generate(attempt.token_ids, attempt.max_tokens)
        for n, token in enumerate(tokens):
            if limit is not None and n == limit:
                who = attempt.prefill if i == 0 else attempt.decode
                raise AttemptFailed(f"{who.name} died", worker=who.name)
            yield TokenEvent(token)
            await asyncio.sleep(0)
        report.finish_reason = "length" if len(tokens) == attempt.max_tokens else "stop"


def _run(svc: RouterService, backend: WorkerBackend, prompt: str, max_tokens: int
         ) -> tuple[list[int], Outcome]:
    async def go() -> tuple[list[int], Outcome]:
        d = Dispatcher(svc.topology, svc.cluster, svc.manager, svc.policy, None,  # type: ignore[arg-type]
                       64, backend=backend, membership=svc.membership)
        req = parse({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                     "temperature": 0}, False, MODEL, 16384, TOK)
        query, decision = d.route(req, "r")
        out = Outcome()
        got = [e.token_id async for e in d.tokens(req, query, decision, out)]
        return got, out

    return asyncio.run(go())


def test_resume_after_tokens_continues_without_repeat_or_drop(engine: Any) -> None:
    svc = _service(max_retries=3)
    backend = Scripted(engine, [3, 2])  # PrfaaS dies after 3 tokens, then a decoder after 2
    prompt = "A long prompt for the PrfaaS cluster. " * 10
    got, out = _run(svc, backend, prompt, 10)
    ids = TOK.encode(prompt)
    assert got == engine.generate(ids, 10) == out.token_ids
    first, second, third = backend.attempts
    assert first.prefill.name == "prfaas-0"
    assert second.token_ids == ids + got[:3] and second.max_tokens == 7
    assert third.token_ids == ids + got[:5] and third.max_tokens == 5
    assert second.prefill.name == "pdp-0"  # resumed on the local path
    assert third.prefill.name == "pdp-0"  # PrfaaS is held down
    assert third.decode.name != second.decode.name  # so is the dead decoder
    assert out.resumed == 2 and not out.retried and "died" in out.resume_reason
    assert out.resumed_at == [3, 5] and out.to_json()["resumed_at"] == [3, 5]
    assert not svc.membership.is_up(second.decode.name)
    assert not svc.membership.is_up("prfaas-0")


def test_failure_before_any_token_is_a_local_retry(engine: Any) -> None:
    svc = _service()
    got, out = _run(svc, Scripted(engine, [0]), "Long " * 80, 4)
    assert got == engine.generate(TOK.encode("Long " * 80), 4)
    assert out.retried and out.resumed == 0 and out.route == "pd"


def test_failure_after_the_last_token_finishes_without_another_attempt(engine: Any) -> None:
    svc = _service()
    backend = Scripted(engine, [4])  # every token sent, `done` lost
    got, out = _run(svc, backend, "x" * 40, 4)
    assert len(backend.attempts) == 1 and len(got) == 4 and out.finish_reason == "length"


def test_retries_exhausted_is_502(engine: Any) -> None:
    svc = _service(max_retries=1, health={"path_wait_s": 0.5})
    with pytest.raises(ApiError) as info:
        _run(svc, Scripted(engine, [1, 1, 1]), "y" * 40, 6)
    assert info.value.status == 502


def test_no_decoder_up_is_503_with_retry_after() -> None:
    svc = _service(health={"retry_after_s": 3})
    for name in ("pdd-0", "pdd-1"):
        svc.membership.suspect(name, "gone")
    d = Dispatcher(svc.topology, svc.cluster, svc.manager, svc.policy, None, 64)  # type: ignore[arg-type]
    req = parse({"model": MODEL, "prompt": "x"}, False, MODEL, 16384, TOK)
    with pytest.raises(ApiError) as info:
        d.route(req, "r")
    assert info.value.status == 503 and info.value.headers() == {"Retry-After": "3"}


def test_guarded_ends_an_attempt_when_its_worker_goes_down() -> None:
    async def run() -> list[int]:
        down = asyncio.Event()

        async def slow() -> AsyncIterator[TokenEvent]:
            for i in range(100):
                if i == 2:
                    asyncio.get_running_loop().call_later(0.05, down.set)
                yield TokenEvent(i)
                await asyncio.sleep(0.02 if i < 2 else 10)

        got: list[int] = []
        with pytest.raises(AttemptFailed, match="pdd-0 went down"):
            async for e in guarded(slow(), lambda: [("pdd-0", down)]):
                got.append(e.token_id)
        return got

    t0 = time.monotonic()
    assert asyncio.run(run()) == [0, 1, 2]
    assert time.monotonic() - t0 < 5  # not the 10 s the stalled attempt would take


def test_kv_deadline_follows_the_predicted_transfer_time() -> None:
    svc = _service(link={"rate_gbps": 0.01, "connections": 1},
                   kv_deadline={"floor_s": 1.0, "multiplier": 3.0},
                   timeouts={"kv_s": 300})  # the cap: never above the kv timeout
    d = Dispatcher(svc.topology, svc.cluster, svc.manager, svc.policy, None, 64)  # type: ignore[arg-type]
    pre = svc.topology.worker("prfaas-0")
    predicted_s = svc.cluster.geometry.size_bytes(1000) * 8 / 0.01e9
    assert predicted_s > 1.0
    assert d._kv_deadline_s(pre, 1000) == pytest.approx(3.0 * predicted_s)
    longer_s = svc.cluster.geometry.size_bytes(8000) * 8 / 0.01e9
    assert longer_s > predicted_s
    assert d._kv_deadline_s(pre, 8000) == pytest.approx(3.0 * longer_s)
    assert d._kv_deadline_s(svc.topology.worker("pdp-0"), 1000) == 1.0  # unshaped: the floor


def test_delay_stage_adds_the_rtt_it_is_told(tmp_path: Path) -> None:
    from prfaas.serve.deploy.delay import DelayStage

    async def run() -> tuple[float, float]:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(1024):
                w.write(data)
                await w.drain()
            w.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = target.sockets[0].getsockname()[1]
        control = tmp_path / "delay-ms"
        stage = DelayStage(control)
        front = await asyncio.start_server(
            lambda r, w: stage.relay(("127.0.0.1", port), r, w), "127.0.0.1", 0)
        watcher = asyncio.create_task(stage.watch())
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])

        async def rtt() -> float:
            t0 = time.monotonic()
            w.write(b"ping")
            await w.drain()
            assert await r.readexactly(4) == b"ping"
            return time.monotonic() - t0

        plain = min([await rtt() for _ in range(3)])
        control.write_text("200")
        await asyncio.sleep(0.2)  # the stage polls its control file every 50 ms
        delayed = min([await rtt() for _ in range(3)])
        w.close()
        watcher.cancel()
        front.close()
        target.close()
        return plain, delayed

    plain, delayed = asyncio.run(run())
    assert delayed >= 0.2 and delayed > plain + 0.15


def test_full_prefill_queue_spills_to_the_other_route_then_429() -> None:
    svc = _service(admission={"max_queued_per_prefill": 2, "retry_after_s": 4})
    d = Dispatcher(svc.topology, svc.cluster, svc.manager, svc.policy, None, 64)  # type: ignore[arg-type]
    req = parse({"model": MODEL, "prompt": "Long " * 80}, False, MODEL, 16384, TOK)
    assert d.route(req, "a")[1].prefill_instance == "prfaas-0"
    d.queued["prfaas-0"] = 2  # PrfaaS backed up: the local cluster takes it
    assert d.route(req, "b")[1].prefill_instance == "pdp-0"
    d.queued["pdp-0"] = 2  # both full: shed
    with pytest.raises(ApiError) as info:
        d.route(req, "c")
    assert info.value.status == 429 and info.value.headers() == {"Retry-After": "4"}


def test_a_prefill_worker_that_answers_an_error_is_not_marked_down() -> None:
    """A decoder dies mid-transfer: the PD-P worker's KV push fails and it answers 502. That
    worker is up (it answered), so the failure must not blame it: a passive mark would leave
    no prefill instance while PrfaaS restarts, and new requests would get 503 (a recovery test
    flake, issue 10). A worker that cannot be reached is blamed."""
    async def decoder(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"event": "ready", "nonce": "n", "cached_tokens": 0}\n')
        await asyncio.sleep(30)  # waits for KV that never comes
        return resp

    async def prefill(_: web.Request) -> web.Response:
        return error_reply(502, "transfer_failed", "PeerGone: send to the decoder")

    async def cancel(_: web.Request) -> web.Response:
        return web.json_response({})

    async def go() -> tuple[str, str]:
        app = web.Application()
        app.router.add_post("/generate", decoder)
        app.router.add_post("/cancel", cancel)
        app.router.add_post("/prefill", prefill)
        # the decoder's handler is still waiting at cleanup: cancel it, not a 60 s grace
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        dec = WorkerSpec("pdd-0", "pd-d", port=port, kv_port=1)
        blamed = []
        async with aiohttp.ClientSession() as session:
            backend = make_backend("native", session=session)
            for pre in (WorkerSpec("pdp-0", "pd-p", port=port),
                        WorkerSpec("pdp-1", "pd-p", port=free_port())):  # nobody listens
                attempt = Attempt(1, [1, 2, 3], 4, {}, pre, dec, ("127.0.0.1", 1),
                                  first_token_s=10, prefill_s=10, kv_deadline_s=5,
                                  token_s=10, connect_s=2)
                with pytest.raises(AttemptFailed) as err:
                    async for _ in backend.run(attempt, AttemptReport()):
                        pass
                blamed.append(err.value.worker)
        await runner.cleanup()
        return blamed[0], blamed[1]

    answered, unreachable = asyncio.run(go())
    assert answered == ""
    assert unreachable == "pdp-1"
