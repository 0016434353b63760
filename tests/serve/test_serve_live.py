"""The live system end to end: router + PrfaaS prefill + PD-P + PD-D as processes.

One deployment, shared with test_openai_live.py (conftest `live`: startup costs a few seconds
per process on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from serve_helpers import MODEL, THRESHOLD_TOKENS, complete, get_text, post

from needs import needs
from prfaas.serve.deploy.launcher import Deployment

pytestmark = pytest.mark.timeout(600)


def _prompts() -> list[str]:
    """50 prompts: 25 below t, 25 above it; groups of long ones share a 320-byte prefix."""
    shared = [f"Shared context {g}. " * 40 for g in range(3)]
    out = []
    for i in range(50):
        if i % 2 == 0:
            out.append(f"Short question number {i}: " + "why? " * (i % 7))
        elif i % 3 == 0:
            out.append(f"Long standalone prompt {i}. " + "tokens " * (45 + 3 * i))
        else:
            out.append(shared[i % 3][:320] + f" then question {i} " + "more " * (i % 11 + 1))
    return out


def test_50_prompts_token_identical_to_generate(live: Deployment, engine: Any) -> None:
    prompts = _prompts()
    with ThreadPoolExecutor(max_workers=8) as pool:  # concurrent: continuous batching
        replies = list(pool.map(lambda p: complete(live.url, p, max_tokens=6), prompts))
    routes = []
    for prompt, reply in zip(prompts, replies, strict=True):
        ids = engine.tokenizer.encode(prompt)
        expected = engine.generate(ids, 6)
        assert reply["prfaas"]["token_ids"] == expected, prompt[:40]
        assert reply["choices"][0]["text"] == engine.tokenizer.decode(expected)
        routes.append((len(ids), reply["prfaas"]["route"]))
    # with no PD-side cache hits, the rule is exactly "uncached length > t"
    for length, route in routes:
        assert route == ("prfaas" if length > THRESHOLD_TOKENS else "pd"), (length, route)
    assert {r for _, r in routes} == {"prfaas", "pd"}


def test_routes_in_responses_and_metrics(live: Deployment) -> None:
    before = get_text(f"{live.url}/metrics")
    short = complete(live.url, "a short one", max_tokens=2)
    long = complete(live.url, "a long one " * 60, max_tokens=2)
    assert short["prfaas"]["route"] == "pd" and short["prfaas"]["prefill_node"] == "pdp-0"
    assert long["prfaas"]["route"] == "prfaas" and long["prfaas"]["prefill_node"] == "prfaas-0"
    assert long["prfaas"]["decode_node"] == "pdd-0" and long["prfaas"]["kv_bytes"] > 0
    after = get_text(f"{live.url}/metrics")

    def count(text: str, route: str) -> float:
        m = re.search(rf'prfaas_requests_total{{outcome="ok",route="{route}"}} (\S+)', text)
        return float(m.group(1)) if m else 0.0

    assert count(after, "pd") == count(before, "pd") + 1
    assert count(after, "prfaas") == count(before, "prfaas") + 1
    assert f"prfaas_threshold_tokens {float(THRESHOLD_TOKENS)}" in after
    assert re.search(r'prfaas_kv_bytes_total{link="inter_dc"} [1-9]', after)
    assert "prfaas_ttft_seconds_bucket" in after and "prfaas_tpot_seconds_count" in after


def test_repeated_long_prompt_is_cached_and_ships_less(live: Deployment) -> None:
    prompt = "A long prompt that comes back. " * 30  # 931 tokens with BOS
    first = complete(live.url, prompt)
    again = complete(live.url, prompt)
    assert first["prfaas"]["route"] == again["prfaas"]["route"] == "prfaas"
    assert first["prfaas"]["cached_tokens"] == 0
    assert again["prfaas"]["cached_tokens"] == 896  # the last full 64-token block boundary
    assert again["prfaas"]["decode_cached_tokens"] == 896
    assert again["prfaas"]["kv_bytes"] < first["prfaas"]["kv_bytes"] / 2
    assert again["prfaas"]["token_ids"] == first["prfaas"]["token_ids"]


def test_prfaas_link_ships_zstd_frames_and_tokens_equal_generate(live: Deployment,
                                                                 engine: Any) -> None:
    """The shared topology's inter-DC link has `compression: zstd`: the KV crossed it in fewer
    bytes than its tensors hold (the prefill worker's sender count), and the decode worker,
    which decompressed it into its receive arena, generates what Engine.generate does."""
    prompt = "Compressed on the wire, decoded exactly. " * 12
    reply = complete(live.url, prompt, max_tokens=6)
    info = reply["prfaas"]
    assert info["route"] == "prfaas"
    assert info["token_ids"] == engine.generate(engine.tokenizer.encode(prompt), 6)
    # control: without compression kv_wire_bytes == kv_bytes (the uncompressed transport test)
    assert 0 < info["kv_wire_bytes"] < info["kv_bytes"]
    status = json.loads(get_text(f"{live.topology.worker('prfaas-0').url}/status"))
    assert status["link"]["compression"] == "zstd"
    assert set(status["link"]["codecs"].values()) == {"zstd"}


@needs("openai")
def test_openai_client_completions_and_chat(live: Deployment, engine: Any) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = "Prefill as a service " * 20
    expected = engine.tokenizer.decode(engine.generate(engine.tokenizer.encode(prompt), 5))
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    assert whole.choices[0].text == expected
    assert whole.model_extra is not None and whole.model_extra["prfaas"]["route"] == "prfaas"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].model_extra is not None and "prfaas" in chunks[-1].model_extra
    messages = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                          temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == len(
        chat.model_extra["prfaas"]["token_ids"])  # type: ignore[index]
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                   max_tokens=4, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content
    assert streamed[-1].model_extra is not None
    assert streamed[-1].model_extra["prfaas"]["route"] == "pd"


@pytest.mark.parametrize(("body", "raw", "param"), [
    (None, b"{not json", None),
    ({"model": MODEL, "max_tokens": 4}, None, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, None, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": -3}, None, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 16384}, None, "max_tokens"),
    ({"model": MODEL, "prompt": "y" * 16384, "max_tokens": 1}, None, "prompt"),
    ({"model": "gpt-4", "prompt": "x", "max_tokens": 4}, None, "model"),
])
def test_bad_input_is_400_with_openai_error(live: Deployment, body: object, raw: bytes | None,
                                            param: str | None) -> None:
    status, reply = post(f"{live.url}/v1/completions", body, raw)
    assert status == 400
    err = reply["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_bad_chat_input_is_400(live: Deployment) -> None:
    status, reply = post(f"{live.url}/v1/chat/completions", {"model": MODEL, "max_tokens": 4})
    assert status == 400 and reply["error"]["param"] == "messages"


def test_health_and_workers_alive(live: Deployment) -> None:
    assert '"ok": true' in get_text(f"{live.url}/health")
    assert all(live.alive().values())


def test_bench_load_against_the_router(live: Deployment) -> None:
    from prfaas.bench.loadgen import run_load
    from prfaas.bench.report import summarize
    from prfaas.bench.workload import Scaling, synthetic

    requests = synthetic(4, Scaling(length_scale=0.03, max_output_tokens=4, seed=3))
    results = asyncio.run(run_load(live.url, MODEL, requests, [0.0, 0.1, 0.2, 0.3], 120.0))
    summary = summarize(results, 5.0)
    assert summary["ok"] == 4, summary["first_errors"]
    assert summary["ttft_s"]["mean"] > 0 and summary["tpot_s"]["mean"] > 0
    # ignore_eos: exactly max_tokens each
    assert [r.output_tokens for r in results] == [q.max_tokens for q in requests]
    assert 0 < summary["router_overhead_s"]["mean"] < summary["e2e_s"]["mean"]
