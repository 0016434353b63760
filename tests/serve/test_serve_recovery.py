"""The issue's "Must show": workers die under load and no accepted request is lost.

Topology: 1 PrfaaS, 1 PD-P, 2 PD-D. 32 mixed requests (16 over t, 16 under; half of them
streamed) are sent one per second; the PrfaaS worker is SIGKILLed at ~8 s and decoder pdd-0 at
~18 s. Every request must complete with exactly the greedy `generate` tokens (computed here
in-process), the router must answer /health throughout, both workers must come back (the
supervisor restarts them: a new pid), and a long prompt after recovery is offloaded again.

Those kills land wherever the load happens to be, so two more faults are placed exactly, each
asserted from the reply's `prfaas` object: a retry (the PrfaaS worker is frozen with SIGSTOP
just before a long request arrives: its prefill never answers, health checks take it down, the
request is retried on the local path with no token sent) and a resume (the decoder serving a
streamed request is SIGKILLed once the client has received its first token: the rest is
generated on the other decoder from prompt + emitted tokens). Both end with the exact tokens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from serve_helpers import MODEL, THRESHOLD_TOKENS, complete, get_text, topology

from prfaas.bench.loadgen import sse_payloads
from prfaas.serve.deploy.launcher import Deployment

pytestmark = pytest.mark.timeout(600)
MAX_TOKENS = 24
KILLS = ((8.0, "prfaas-0"), (18.0, "pdd-0"))


def stream_complete(url: str, prompt: str, max_tokens: int,
                    on_first: Callable[[], None] | None = None) -> dict[str, Any]:
    """A streamed completion read chunk by chunk: the text and the last chunk's `prfaas`;
    `on_first` runs once the first token's chunk has been received."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    text, last = [], {}
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200
        for chunk in sse_payloads(resp):
            assert "error" not in chunk, chunk
            if chunk["choices"]:  # the usage chunk (include_usage) has none
                text.append(chunk["choices"][0]["text"])
                if on_first is not None and text[-1]:
                    on_first()
                    on_first = None
            last = chunk
    return {"text": "".join(text), "prfaas": last["prfaas"], "usage": last["usage"]}


def _prompts() -> list[str]:
    out = []
    for i in range(32):
        if i % 2:  # over t: 300-550 tokens (cheap on CPU), offloaded to PrfaaS
            out.append(f"Long request {i} for the remote prefill cluster. " * (6 + i % 5))
        else:
            out.append(f"Short question {i}: " + "why? " * (i % 5))
    return out


class HealthWatch(threading.Thread):
    """Polls the router's /health every 0.2 s; counts the polls that failed."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.ok, self.failed = url, 0, 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            try:
                get_text(f"{self.url}/health")
                self.ok += 1
            except OSError:
                self.failed += 1


def _members(url: str) -> dict[str, Any]:
    members: dict[str, Any] = json.loads(get_text(f"{url}/health"))["members"]
    return members


def _wait_back(dep: Deployment, name: str, old_pid: int, limit_s: float = 300) -> int:
    """Readiness-driven: the supervisor's new process answers and the router holds it up."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        state = _members(dep.url)[name]
        if dep.pid(name) != old_pid and state["up"] and state["pid"] == dep.pid(name):
            return dep.pid(name)
        time.sleep(0.2)
    raise AssertionError(f"{name} not back within {limit_s} s: {_members(dep.url)[name]}")


def test_two_workers_killed_under_load_lose_nothing(engine: Any) -> None:
    topo = topology(workers=[{"name": "prfaas-0", "role": "prfaas"},
                             {"name": "pdp-0", "role": "pd-p"},
                             {"name": "pdd-0", "role": "pd-d"}, {"name": "pdd-1", "role": "pd-d"}],
                    max_retries=3, timeouts={"connect_s": 3, "prefill_s": 120, "kv_s": 60,
                                             "token_s": 60})
    prompts = _prompts()
    expected = [engine.generate(engine.tokenizer.encode(p), MAX_TOKENS) for p in prompts]
    with Deployment(topo, log_dir=os.environ.get("PRFAAS_TEST_LOGS")) as dep:
        old = {name: dep.pid(name) for _, name in KILLS}
        watch = HealthWatch(dep.url)
        watch.start()
        futures: list[Future[dict[str, Any]]] = []
        with ThreadPoolExecutor(max_workers=32) as pool:
            t0 = time.monotonic()
            kills = list(KILLS)
            for i, prompt in enumerate(prompts):
                while time.monotonic() < t0 + i:  # one request per second, kills on schedule
                    if kills and time.monotonic() >= t0 + kills[0][0]:
                        os.kill(dep.pid(kills.pop(0)[1]), signal.SIGKILL)
                    time.sleep(0.01)
                call = stream_complete if i % 4 >= 2 else _whole
                futures.append(pool.submit(call, dep.url, prompt, MAX_TOKENS))
            replies = [f.result() for f in futures]
        new = {name: _wait_back(dep, name, pid) for name, pid in old.items()}
        after = complete(dep.url, "After recovery, a long prompt again. " * 20, max_tokens=3)
        retried = _retry_after_a_frozen_prefill(dep, engine)
        resumed = _resume_after_the_first_token(dep, engine)
        metrics = get_text(f"{dep.url}/metrics")
        watch.halt.set()
        watch.join(5)
        log = (dep.log_dir / "launcher.log").read_text()
    assert not kills  # both kills happened while requests were being sent
    for i, (reply, tokens) in enumerate(zip(replies, expected, strict=True)):
        assert reply["prfaas"]["token_ids"] == tokens, (i, reply["prfaas"])
        assert reply["usage"]["completion_tokens"] == len(tokens)
        assert reply["text"] == engine.tokenizer.decode(tokens)
    assert watch.failed == 0 and watch.ok > 100  # the router answered throughout
    assert all(new[n] != old[n] for n in old)
    assert after["prfaas"]["route"] == "prfaas" and len(after["prfaas"]["token_ids"]) == 3
    assert 'prfaas_worker_restarts_total{worker="prfaas-0"} 1.0' in metrics
    assert "prfaas-0 (pid" in log and "pdd-0 restarted as pid" in log
    lengths = [len(engine.tokenizer.encode(p)) for p in prompts]
    assert sum(n > THRESHOLD_TOKENS for n in lengths) == 16
    assert retried["retried"] and not retried["resumed"], retried  # no token had been sent
    assert retried["route"] == "pd" and retried["first_route"] == "prfaas", retried
    assert resumed["resumed"] >= 1 and not resumed["retried"], resumed
    print(f"\nretry: {retried['retry_reason'][:100]}\nresume: {resumed['resume_reason'][:100]}")
    hit = [r["prfaas"] for r in replies if r["prfaas"]["retried"] or r["prfaas"]["resumed"]]
    print(f"\nrecovered: {len(hit)} of 32 requests retried or resumed: "
          f"{[(h['route'], h['retried'], h['resumed'], h['retry_reason'][:90]) for h in hit]}")


def _whole(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    reply = complete(url, prompt, max_tokens=max_tokens)
    return {"text": reply["choices"][0]["text"], "prfaas": reply["prfaas"],
            "usage": reply["usage"]}


def _retry_after_a_frozen_prefill(dep: Deployment, engine: Any) -> dict[str, Any]:
    """A long request reaches a PrfaaS worker that no longer answers: retried, exact tokens."""
    prompt = "A long prompt for a frozen prefill worker. " * 12
    pid = dep.pid("prfaas-0")
    os.kill(pid, signal.SIGSTOP)  # before the request: the router still holds it up
    try:
        reply = _whole(dep.url, prompt, 8)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert reply["prfaas"]["token_ids"] == engine.generate(engine.tokenizer.encode(prompt), 8)
    _wait_up(dep, "prfaas-0")
    return dict(reply["prfaas"])


def _resume_after_the_first_token(dep: Deployment, engine: Any) -> dict[str, Any]:
    """The decoder of a streamed request dies after the first token reached the client."""
    prompt, n = "Resume me: ", 160
    killed: list[str] = []

    def kill_its_decoder() -> None:  # the only request in flight: its decoder holds one
        metrics = get_text(f"{dep.url}/metrics")
        busy = [w for w in ("pdd-0", "pdd-1")
                if re.search(rf'^prfaas_inflight_requests{{worker="{w}"}} 1(\.0)?$', metrics,
                             re.MULTILINE)]
        assert len(busy) == 1, busy
        os.kill(dep.pid(busy[0]), signal.SIGKILL)
        killed.append(busy[0])

    reply = stream_complete(dep.url, prompt, n, on_first=kill_its_decoder)
    tokens = engine.generate(engine.tokenizer.encode(prompt), n)
    assert reply["prfaas"]["token_ids"] == tokens, reply["prfaas"]
    assert reply["text"] == engine.tokenizer.decode(tokens)
    assert reply["prfaas"]["decode_node"] != killed[0], (killed, reply["prfaas"])
    return dict(reply["prfaas"])


def _wait_up(dep: Deployment, name: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not _members(dep.url)[name]["up"]:
        assert time.monotonic() < deadline, _members(dep.url)[name]
        time.sleep(0.2)
