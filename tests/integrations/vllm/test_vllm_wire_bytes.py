"""What the vLLM route reports as having crossed the link, with and without compression, with
no vLLM instance: a real transfer over the connector's links, the decoder's count through the
scheduler half's `request_finished` params, the stream event stream_params.py adds, the router's
vLLM backend and the dispatcher's accounting (the response's `kv_wire_bytes`, the controller's
egress). The negative control is the codec: compressed, the count is the sender's wire bytes
and not the tensor bytes; uncompressed, the two are equal."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from vllm_live import serve_completions

from needs import needs
from prfaas.integrations.vllm import stream_params
from prfaas.integrations.vllm.link import Finish, RecvLink, Result, SendLink, Tensor
from prfaas.integrations.vllm.params import RecvParams
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.backends import Attempt, AttemptReport, make_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.router.dispatch import Dispatcher, Outcome
from prfaas.serve.topology import parse_topology
from prfaas.transport.receiver import ReceiverConfig
from prfaas.transport.sender import SenderConfig


def _done(link: SendLink | RecvLink, timeout_s: float = 20.0) -> Result:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = link.drain()
        if got:
            [result] = got
            return result
        time.sleep(0.02)
    raise AssertionError("no transfer result")


def _transfer(compression: str) -> tuple[Result, Result, int]:
    """A KV-like transfer (bf16 words of a few distinct values: compressible) over the
    connector's links; (sender's result, receiver's result, tensor bytes)."""
    rng = np.random.default_rng(3)
    layers = [rng.integers(0x3F00, 0x3F08, size=(8, 16384), dtype=np.uint16) for _ in range(3)]
    recv = RecvLink(ReceiverConfig(port=0), lambda *t: None)
    send = SendLink(SenderConfig(num_connections=2, chunk_bytes=64 * 1024,
                                 compression=compression))
    try:
        dest = ("127.0.0.1", recv.receiver.port)
        recv.expect(21, 20.0)
        for i, a in enumerate(layers):
            send.submit(dest, Tensor(21, i, f"b{i}", a, bfloat16=True))
        send.submit(dest, Finish(21))
        got, sent = _done(recv), _done(send)
    finally:
        send.stop()
        recv.stop()
    assert got.error is None and sent.error is None, (got, sent)
    return sent, got, sum(a.nbytes for a in layers)


def _finished_params(wire_bytes: int) -> dict[str, Any] | None:
    """The decode request's params from the scheduler half, given the worker's count."""
    from prfaas.integrations.vllm.metadata import PrfaasWorkerMeta
    from prfaas.integrations.vllm.scheduler_half import SchedulerHalf

    req = SimpleNamespace(request_id="r", kv_transfer_params=RecvParams(21, 30.0).to_body())
    half = SchedulerHalf(SimpleNamespace(has_mamba_layers=False, kv_cache_groups=[]))
    half.on_new_request(req)  # type: ignore[arg-type]
    half.update_connector_output(SimpleNamespace(  # type: ignore[arg-type]
        kv_connector_worker_meta=PrfaasWorkerMeta({}, {"r": wire_bytes}),
        finished_recving={"r"}))
    _, params = half.request_finished(req)  # type: ignore[arg-type]
    return params


class FakeServing:
    """vLLM's completion stream generator, in shape: one event per output, then [DONE]."""

    async def completion_stream_generator(self, request: object,
                                          result_generator: AsyncIterator[Any],
                                          request_id: str) -> AsyncIterator[str]:
        async for _, out in result_generator:
            chunk = {"choices": [{"text": "", "token_ids": out.token_ids,
                                  "finish_reason": out.finish_reason}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"


async def _stream_lines(final_params: dict[str, Any] | None) -> list[str]:
    async def outputs() -> AsyncIterator[tuple[int, Any]]:
        yield 0, SimpleNamespace(token_ids=[5], finish_reason=None, kv_transfer_params=None)
        yield 0, SimpleNamespace(token_ids=[6], finish_reason="length",
                                 kv_transfer_params=final_params)
    return [line async for line in FakeServing().completion_stream_generator(
        None, result_generator=outputs(), request_id="x")]


def _route(lines: list[str], kv_bytes: int) -> tuple[AttemptReport, Outcome, LiveCluster]:
    """The router's vLLM backend on that decode stream, then the dispatcher's accounting."""
    # the router's side only: the instances are the scripted servers below (the tiny native
    # engine gives the cluster a KV geometry without vLLM model files)
    topo = parse_topology({"name": "wb", "model": {"preset": "tiny"}, "link": {
        "rate_gbps": 0.5, "compression": "lz4"}, "workers": [
        {"name": "prfaas-0", "role": "prfaas"}, {"name": "pdp-0", "role": "pd-p"},
        {"name": "pdd-0", "role": "pd-d"}]}).with_ports()
    pre, dec = topo.by_role("prfaas")[0], topo.by_role("pd-d")[0]

    async def prefill(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"token_ids": [9]}], "kv_transfer_params": {
            "prfaas": {"kv_bytes": kv_bytes}}})

    async def decode(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for line in lines:
            await resp.write(line.encode())
        return resp

    async def go() -> tuple[AttemptReport, Outcome, LiveCluster]:
        rp, p_port = await serve_completions(prefill)
        rd, d_port = await serve_completions(decode)
        p = replace(pre, host="127.0.0.1", port=p_port)
        d = replace(dec, host="127.0.0.1", port=d_port)
        attempt = Attempt(1, [1, 2, 3], 2, {"temperature": 0.0}, p, d,
                          ("127.0.0.1", 1), first_token_s=10, prefill_s=10, kv_deadline_s=10,
                          token_s=10, connect_s=2)
        report = AttemptReport()
        try:
            async with aiohttp.ClientSession() as session:
                backend = make_backend("vllm", session=session, report_inserts=False)
                tokens = [ev.token_id async for ev in backend.run(attempt, report)]
                assert tokens == [5, 6]
                cluster = LiveCluster(topo, engine_backend(topo).card().kv)
                dispatcher = Dispatcher(topo, cluster, None, None, session,  # type: ignore[arg-type]
                                        block_size_tokens=16, backend=backend)
                out = Outcome()
                dispatcher._apply_report(pre, report, out)
        finally:
            await rp.cleanup()
            await rd.cleanup()
        return report, out, cluster

    return asyncio.run(go())


@needs("vllm")  # the scheduler half imports vLLM's types
@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_the_vllm_route_reports_what_crossed_the_link(compression: str) -> None:
    sent, got, tensor_bytes = _transfer(compression)
    assert got.wire_bytes == sent.wire_bytes  # the receiver counts what the sender wrote
    assert sent.wire_bytes is not None
    if compression == "none":
        assert sent.wire_bytes == tensor_bytes
    else:  # the control: compressed, the wire count is not the tensors' bytes
        assert sent.wire_bytes < 0.9 * tensor_bytes
    params = _finished_params(got.wire_bytes)  # type: ignore[arg-type]
    assert params == {"prfaas": {"kv_wire_bytes": sent.wire_bytes}}
    stream_params.install(FakeServing)
    lines = asyncio.run(_stream_lines(params))
    assert lines[-1] == "data: [DONE]\n\n" and lines[-2] == stream_params.params_event(
        {"kv_wire_bytes": sent.wire_bytes})
    report, out, cluster = _route(lines, tensor_bytes)
    assert report.kv_bytes == tensor_bytes and report.kv_wire_bytes == sent.wire_bytes
    assert out.kv_bytes == tensor_bytes and out.kv_wire_bytes == sent.wire_bytes
    assert cluster.monitor.total_sent_bytes == sent.wire_bytes  # the controller's egress


def test_a_stream_without_prfaas_params_is_left_as_vllm_sent_it() -> None:
    """No count (a producer, a failed load): no extra event, and the router keeps None (it
    then counts the tensor bytes as egress, as before)."""
    stream_params.install(FakeServing)
    stream_params.install(FakeServing)  # idempotent: one wrapper, not two
    lines = asyncio.run(_stream_lines(None))
    assert len(lines) == 3 and not any("kv_transfer_params" in ln for ln in lines)
    report, out, cluster = _route(lines, 1000)
    assert report.kv_wire_bytes is None and out.kv_wire_bytes is None
    assert cluster.monitor.total_sent_bytes == 1000


def test_a_vllm_whose_stream_generator_changed_fails_the_start() -> None:
    class Changed:
        async def completion_stream_generator(self, request: object) -> AsyncIterator[str]:
            yield "data: [DONE]\n\n"

    with pytest.raises(Exception, match="result_generator"):
        stream_params.install(Changed)
