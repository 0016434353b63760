"""The vLLM backend: one attempt on a (prefill, decode) pair of vLLM instances (docs/vllm.md).

Both halves are sent AT ONCE, so the decoder holds its blocks and receives KV while the prefill
still computes (PrfaasConnector streams layer by layer): the decode instance gets the prompt,
the sampling parameters and `kv_transfer_params` {role: recv, transfer_id} and streams tokens
(SSE, token ids included); the prefill instance gets the prompt with `max_tokens: 1` and
{role: send, transfer_id, dest: the decoder's kv_port}. A prefill that fails closes the decode
stream (vLLM aborts the waiting request); a KV load that fails (connection lost, bad frame,
timeout, fingerprint mismatch) ends the decode request with an error, never with tokens computed
from wrong KV: either is an `AttemptFailed`, and the dispatcher retries on the local path.
Cache state: every full block of a prompt an instance computed or received is in its prefix
cache afterwards (vLLM caches them all), so the backend reports those hashes as inserts -
unless the instances publish their KV events (`vllm.kv_events`, kv_events.py), which then are
the only source (`report_inserts=False`): they also report evictions.
Bytes: the prefill's reply carries the tensor bytes its connector queued (`kv_bytes`); the
decode stream's last event carries the bytes the load took on the wire (`kv_wire_bytes`,
compressed where they were: stream_params.py), which the dispatcher counts as the link's egress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from prfaas.cache import chain_hashes
from prfaas.integrations.vllm.params import KEY, RecvParams, SendParams
from prfaas.serve.router.backends.base import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
    next_line,
)

# sampling keys vLLM's OpenAI API takes under the same name (logit_bias: converted; the
# prompt logprobs of `echo` are not passed: vLLM computes them only without a KV load)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                 "stop", "stop_token_ids", "logprobs", "n")


class VllmBackend(WorkerBackend):
    name = "vllm"

    def __init__(self, session: aiohttp.ClientSession, served_name: str = "tiny",
                 block_size_tokens: int = 128, kv_bytes_per_token: float = 0.0,
                 kv_fixed_bytes: int = 0, report_inserts: bool = True, **_: object) -> None:
        self.session, self.served_name = session, served_name
        self.report_inserts = report_inserts
        self.block_size_tokens = block_size_tokens
        self.kv_bytes_per_token, self.kv_fixed_bytes = kv_bytes_per_token, kv_fixed_bytes

    def _body(self, a: Attempt, max_tokens: int, params: dict[str, Any]) -> dict[str, Any]:
        sampling = {k: v for k, v in a.sampling.items() if k in SAMPLING_KEYS and v is not None}
        if a.sampling.get("logit_bias"):
            sampling["logit_bias"] = {str(int(t)): float(b) for t, b in a.sampling["logit_bias"]}
        if max_tokens == 1:  # the prefill half: one sequence, no logprobs
            sampling = {k: v for k, v in sampling.items() if k not in ("n", "logprobs")}
        return {"model": self.served_name, "prompt": a.token_ids, "max_tokens": max_tokens,
                **sampling, "return_token_ids": True, "return_tokens_as_token_ids": True,
                "kv_transfer_params": params}

    async def run(self, attempt: Attempt, report: AttemptReport) -> AsyncIterator[TokenEvent]:
        a, dec = attempt, attempt.decode
        tid = secrets.randbits(62) + 1
        # a resume: the decoder draws the seeded samples of the tokens already sent first
        nonce = secrets.token_hex(16)  # this attempt's: the KV manifest must carry it
        recv = RecvParams(tid, a.first_token_s,
                          output_offset=int(a.sampling.get("output_offset") or 0), nonce=nonce)
        body = {**self._body(a, a.max_tokens, recv.to_body()),
                "stream": True, "stream_options": {"include_usage": True}}
        prefill: asyncio.Task[None] | None = None
        emitted = False
        progress = [False]  # tokens yielded: the stream's wait switches to token_s
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=a.connect_s)
            async with self.session.post(f"{dec.url}/v1/completions", json=body,
                                         timeout=timeout, server_hostname=dec.tls_name) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise AttemptFailed(f"decode {dec.name} answered HTTP {resp.status}: {text}",
                                        worker=dec.name if resp.status >= 500 else "")
                prefill = asyncio.create_task(self._prefill(a, tid, nonce, report))
                async for event in _events(resp, prefill, a, dec.name, progress):
                    if event.get("error"):
                        raise AttemptFailed(f"decode {dec.name}: {event['error']}", emitted)
                    _wire_bytes(event, report)
                    for token in self._tokens(event, report):
                        emitted = progress[0] = True
                        yield token
                if report.finish_reason in ("", "error", "abort"):
                    raise AttemptFailed(f"decode {dec.name} ended with finish_reason="
                                        f"{report.finish_reason or 'none'} (KV load failed?)",
                                        emitted)
                await asyncio.wait_for(prefill, a.prefill_s)
                report.cache_deltas.append((dec.name, self._inserted(a.token_ids)))
        except AttemptFailed as exc:
            exc.emitted = exc.emitted or emitted
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptFailed(f"{type(exc).__name__}: {exc}", emitted, dec.name) from exc
        finally:
            if prefill is not None and not prefill.done():
                prefill.cancel()
                with contextlib.suppress(asyncio.CancelledError, AttemptFailed):
                    await prefill

    def _tokens(self, event: dict[str, Any], report: AttemptReport) -> list[TokenEvent]:
        if isinstance(event.get("usage"), dict):
            details = event["usage"].get("prompt_tokens_details") or {}
            report.decode_cached_tokens = int(details.get("cached_tokens") or 0)
        out: list[TokenEvent] = []
        for choice in event.get("choices") or ():
            ids = [int(t) for t in choice.get("token_ids") or ()]
            logprobs = choice.get("logprobs") or {}
            lps = logprobs.get("token_logprobs") or []
            tops = logprobs.get("top_logprobs") or []
            for i, t in enumerate(ids):
                extra: dict[str, Any] = {"seq": int(choice.get("index", 0)), "text":
                                         choice.get("text", "") if i == len(ids) - 1 else ""}
                if i < len(lps) and lps[i] is not None:
                    extra["lp"] = float(lps[i])
                if i < len(tops) and isinstance(tops[i], dict):
                    extra["top"] = [(int(k.rsplit(":", 1)[-1]), float(v))
                                    for k, v in tops[i].items()]
                out.append(TokenEvent(t, extra))
            if choice.get("finish_reason"):
                report.finish_reason = str(choice["finish_reason"])
        return out

    def _inserted(self, token_ids: list[int]) -> dict[str, Any]:
        if not self.report_inserts:
            return {}
        return {"inserted": chain_hashes(token_ids, self.block_size_tokens)}

    async def _prefill(self, a: Attempt, tid: int, nonce: str, report: AttemptReport) -> None:
        pre = a.prefill
        body = self._body(a, 1, SendParams(tid, *a.kv_dest, nonce=nonce).to_body())
        timeout = aiohttp.ClientTimeout(total=a.prefill_s, sock_connect=a.connect_s)
        t0 = time.monotonic()
        try:
            async with self.session.post(f"{pre.url}/v1/completions", json=body,
                                         timeout=timeout, server_hostname=pre.tls_name) as resp:
                reply: Any = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptFailed(f"prefill {pre.name}: {type(exc).__name__}: {exc}",
                                worker=pre.name) from exc
        if resp.status != 200 or not isinstance(reply, dict):
            # a 5xx from vLLM's API server is its engine failing (EngineDeadError): down;
            # a KV send that fails does not fail the producer's request (the consumer reports)
            raise AttemptFailed(f"prefill {pre.name} answered HTTP {resp.status}: "
                                f"{str(reply)[:300]}",
                                worker=pre.name if resp.status >= 500 else "")
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        report.prefill_done = True
        report.prefill_s = time.monotonic() - t0
        report.cached_tokens = int(details.get("cached_tokens") or 0)
        report.computed_tokens = len(a.token_ids) - report.cached_tokens
        # counted by the prefill instance's connector (payload bytes of every tensor it put
        # on the link for this request); the size model only when a connector reports none
        counted = ((reply.get("kv_transfer_params") or {}).get("prfaas") or {}).get("kv_bytes")
        report.kv_bytes = (int(counted) if counted is not None else
                           int(len(a.token_ids) * self.kv_bytes_per_token + self.kv_fixed_bytes))
        report.cache_deltas.append((pre.name, self._inserted(a.token_ids)))


def _wire_bytes(event: dict[str, Any], report: AttemptReport) -> None:
    """The decode stream's last event (stream_params.py): what its KV took on the wire."""
    counted = ((event.get("kv_transfer_params") or {}).get(KEY) or {}).get("kv_wire_bytes")
    if counted is not None:
        report.kv_wire_bytes = int(counted)


async def _events(resp: aiohttp.ClientResponse, prefill: asyncio.Task[None], a: Attempt,
                  decoder: str, progress: list[bool]) -> AsyncIterator[dict[str, Any]]:
    """The decode stream's SSE payloads until [DONE]; a failed prefill ends it early."""
    while True:
        wait_s = a.token_s if progress[0] else a.first_token_s
        raw = await next_line(resp, prefill, wait_s, f"token from {decoder}")
        if not raw:
            raise AttemptFailed(f"the decode instance {decoder} closed the stream early",
                                worker=decoder)
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        payload: dict[str, Any] = json.loads(data)
        yield payload
