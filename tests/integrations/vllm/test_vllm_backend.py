"""The router's vLLM backend against scripted vLLM servers (no vLLM needed): both halves are
sent at once, the decoder's stream is relayed as token events, and every failure mode (a
prefill that fails, a decoder that ends in error, a KV load that fails) is an AttemptFailed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from vllm_live import serve_completions

from prfaas.serve.router.backends import Attempt, AttemptFailed, AttemptReport, make_backend
from prfaas.serve.topology import WorkerSpec


class FakeVllm:
    """P answers after `prefill_delay_s`; D streams only once P has been asked (so a backend
    that waited for P's answer before asking D would still pass, but one that never asked P
    would hang), ending with `finish` ("length", "error"...)."""

    def __init__(self, finish: str = "length", prefill_status: int = 200) -> None:
        self.finish, self.prefill_status = finish, prefill_status
        self.p_asked = asyncio.Event()
        self.bodies: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []

    async def prefill(self, request: web.Request) -> web.Response:
        self.bodies["p"] = await request.json()
        self.order.append("p")
        self.p_asked.set()
        await asyncio.sleep(0.05)
        return web.json_response({"choices": [{"token_ids": [9]}], "usage": {
            "prompt_tokens_details": {"cached_tokens": 128}}}, status=self.prefill_status)

    async def decode(self, request: web.Request) -> web.StreamResponse:
        self.bodies["d"] = await request.json()
        self.order.append("d")
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.wait_for(self.p_asked.wait(), 5)
        for i, tok in enumerate((5, 6, 7)):
            last = i == 2
            chunk = {"choices": [{"text": f"t{tok}", "token_ids": [tok], "finish_reason":
                                  self.finish if last else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _attempt(p_port: int, d_port: int, **sampling: Any) -> Attempt:
    pre = WorkerSpec("prfaas-0", "prfaas", port=p_port, engine="vllm")
    dec = WorkerSpec("pdd-0", "pd-d", port=d_port, kv_port=4321, engine="vllm")
    return Attempt(1, [1, 2, 3], 3, {"temperature": 0.0, "top_p": 1.0, "seed": 0,
                                     "ignore_eos": False, "not_a_vllm_key": 1, **sampling},
                   pre, dec, (dec.host, dec.kv_port), first_token_s=10, prefill_s=10,
                   kv_deadline_s=10, token_s=10, connect_s=2)


def _run(fake: FakeVllm, **sampling: Any) -> tuple[list[int], AttemptReport, Exception | None]:
    async def go() -> tuple[list[int], AttemptReport, Exception | None]:
        rp, p_port = await serve_completions(fake.prefill)
        rd, d_port = await serve_completions(fake.decode)
        report, got, err = AttemptReport(), [], None
        try:
            async with aiohttp.ClientSession() as session:
                backend = make_backend("vllm", session=session, served_name="tiny",
                                       block_size_tokens=2)
                try:
                    async for ev in backend.run(_attempt(p_port, d_port, **sampling), report):
                        got.append(ev.token_id)
                except AttemptFailed as exc:
                    err = exc
        finally:
            await rp.cleanup()
            await rd.cleanup()
        return got, report, err
    return asyncio.run(go())


def test_both_halves_go_at_once_and_tokens_are_relayed() -> None:
    fake = FakeVllm()
    got, report, err = _run(fake)
    assert err is None and got == [5, 6, 7]
    assert fake.order[0] == "d"  # the decoder is asked first, the prefill without waiting
    p, d = fake.bodies["p"], fake.bodies["d"]
    assert p["max_tokens"] == 1 and d["max_tokens"] == 3 and d["stream"] is True
    tid = p["kv_transfer_params"]["prfaas"]["transfer_id"]
    nonce = p["kv_transfer_params"]["prfaas"]["nonce"]  # one fresh nonce, in both halves
    assert len(nonce) == 32
    assert d["kv_transfer_params"]["prfaas"] == {"role": "recv", "transfer_id": tid,
                                                 "timeout_s": 10, "nonce": nonce}
    assert p["kv_transfer_params"]["prfaas"]["dest_port"] == 4321
    assert "not_a_vllm_key" not in d and d["temperature"] == 0.0
    assert report.finish_reason == "length" and report.prefill_done
    assert report.cached_tokens == 128
    pools = {pool for pool, _ in report.cache_deltas}
    assert pools == {"prfaas-0", "pdd-0"}


def test_a_decoder_ending_in_error_is_a_failed_attempt() -> None:
    got, _, err = _run(FakeVllm(finish="error"))
    assert isinstance(err, AttemptFailed) and "error" in str(err) and got == [5, 6, 7]
    assert err.emitted  # tokens had been relayed: the dispatcher resumes, not retries


def test_a_failed_prefill_is_a_failed_attempt_naming_the_prefill() -> None:
    _, _, err = _run(FakeVllm(prefill_status=500))
    assert isinstance(err, AttemptFailed) and err.worker == "prfaas-0", err


def test_a_resume_tells_the_decoder_its_output_offset() -> None:
    """The dispatcher's `output_offset` (tokens already sent) reaches the decoder's connector,
    which draws that many seeded samples first (seed_offset.py); a fresh request has none."""
    fake = FakeVllm()
    _, _, err = _run(fake, output_offset=2, seed=7, temperature=1.0)
    assert err is None
    assert fake.bodies["d"]["kv_transfer_params"]["prfaas"]["output_offset"] == 2
    assert "output_offset" not in fake.bodies["d"]  # not a vLLM sampling key
    assert "output_offset" not in fake.bodies["p"]["kv_transfer_params"]["prfaas"]
