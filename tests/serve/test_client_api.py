"""What benchmark clients send and read, against the live router (the deployment shared with
test_serve_live.py): the default request bodies of guidellm, aiperf and `vllm bench serve`
(captured from the clients, tests/serve/data/client_requests.json), usage in every chunk,
the router's per-request log, `/tokenize`, and the clear 400s a wrong model or tokenizer gets.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import MODEL, post

from prfaas.models.tokenizer import ByteTokenizer
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.router.openai_api import chat_prompt
from prfaas.serve.router.request_log import read

pytestmark = pytest.mark.timeout(600)
CAPTURED = json.loads((Path(__file__).parent / "data" / "client_requests.json").read_text())
TOK = ByteTokenizer()


def stream(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
           ) -> list[dict[str, Any]]:
    """The SSE chunks of a streamed request (asserts 200 and a closing [DONE])."""
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200
        lines = [ln.decode().strip() for ln in resp if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def _small(body: dict[str, Any]) -> dict[str, Any]:
    """A captured body (prompt text replaced, 4 output tokens) for the model served here."""
    assert body["model"] == MODEL
    out = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        if key in out:
            out[key] = 4
    return out


@pytest.mark.parametrize("name", sorted(CAPTURED["requests"]))
def test_each_clients_default_request_is_served(live: Deployment, name: str) -> None:
    """The body each client sends by default streams to the end with the usage it asked for;
    the same body with one field vLLM's server would not honour either is a 400 naming it
    (the control: the router still refuses what it does not support)."""
    captured = CAPTURED["requests"][name]
    body = _small(captured["body"])
    chunks = stream(live.url, captured["path"], body)
    texts = [c for c in chunks if c.get("choices")]
    assert texts and all(c["model"] == MODEL for c in chunks)
    opts = body.get("stream_options") or {}
    if opts.get("include_usage"):  # aiperf does not send ignore_eos: EOS may come first
        n = chunks[-1]["usage"]["completion_tokens"]
        assert chunks[-1]["choices"] == [] and (n == 4 if body.get("ignore_eos") else 1 <= n <= 4)
    if opts.get("continuous_usage_stats"):
        assert all("usage" in c for c in texts)
    status, reply = post(f"{live.url}{captured['path']}", {**body, "suffix": "tail"})
    assert status == 400 and reply["error"]["param"] == "suffix"


def test_continuous_usage_counts_up_in_every_chunk(live: Deployment) -> None:
    prompt = "count my tokens"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = stream(live.url, "/v1/completions", body)
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == sorted(counts) and counts[-1] == 6 and counts[0] == 1
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {len(TOK.encode(prompt))}
    plain = stream(live.url, "/v1/completions", {**body, "stream_options": {
        "include_usage": True}})  # the control: usage in the closing chunk only
    assert [("usage" in c) for c in plain] == [False] * (len(plain) - 1) + [True]


def test_request_log_has_each_request_joined_by_the_clients_id(live: Deployment) -> None:
    log: Path = live.request_log  # type: ignore[attr-defined]
    rid = f"test-{time.time_ns()}"
    chunks = stream(live.url, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "log me"}], "max_tokens": 3,
        "ignore_eos": True, "stream": True}, headers={"X-Request-Id": rid})
    status, _ = post(f"{live.url}/v1/completions", {"model": MODEL, "prompt": "x",
                                                    "temprature": 1})
    assert status == 400
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entries = read(log)
        mine = [e for e in entries if e["x_request_id"] == rid]
        refused = [e for e in entries if e["param"] == "temprature"]
        if mine and refused:
            break
        time.sleep(0.1)
    [entry] = mine
    assert entry["id"] == chunks[0]["id"] and entry["status"] == 200 and entry["stream"]
    expected = TOK.encode(chat_prompt([{"role": "user", "content": "log me"}]))
    assert entry["prompt_tokens"] == len(expected) and entry["completion_tokens"] == 3
    assert entry["route"] in ("pd", "prfaas")
    assert 0 < entry["ttft_s"] <= entry["first_text_s"] <= entry["e2e_s"]
    assert refused[-1]["status"] == 400 and "unknown parameter" in refused[-1]["error"]


def test_tokenize_counts_what_a_request_is_charged(live: Deployment) -> None:
    messages = [{"role": "user", "content": "héllo"}]
    for body, path, req in (({"prompt": "héllo"}, "/v1/completions", {"prompt": "héllo"}),
                            ({"messages": messages}, "/v1/chat/completions",
                             {"messages": messages})):
        status, tok = post(f"{live.url}/tokenize", {"model": MODEL, **body})
        assert status == 200 and tok["count"] == len(tok["tokens"])
        status, reply = post(f"{live.url}{path}", {"model": MODEL, "max_tokens": 1, **req})
        assert status == 200 and reply["usage"]["prompt_tokens"] == tok["count"]
    status, tok = post(f"{live.url}/tokenize", {"model": MODEL, "prompt": "héllo"})
    assert tok["tokens"] == TOK.encode("héllo")
    status, text = post(f"{live.url}/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
    assert status == 200 and text["prompt"] == "héllo"


@pytest.mark.parametrize(("path", "body", "param", "needle"), [
    ("/v1/completions", {"model": "gpt2", "prompt": "x"}, "model", "serves 'prfaas-tiny-kda'"),
    ("/v1/chat/completions", {"model": "Qwen/Qwen3-0.6B", "messages": [
        {"role": "user", "content": "x"}]}, "model", "prfaas tokenizer"),
    # token ids from a 50K-vocabulary tokenizer
    ("/v1/completions", {"model": MODEL, "prompt": [15496, 995]}, "prompt",
     "another tokenizer"),
    ("/tokenize", {"model": "gpt2", "prompt": "x"}, "model", "does not exist"),
])
def test_wrong_model_or_tokenizer_is_a_clear_400(live: Deployment, path: str,
                                                 body: dict[str, Any], param: str,
                                                 needle: str) -> None:
    status, reply = post(f"{live.url}{path}", body)
    assert status == 400 and reply["error"]["param"] == param
    assert needle in reply["error"]["message"]
