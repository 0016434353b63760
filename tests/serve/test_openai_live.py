"""OpenAI parameters end to end with the official `openai` client, against the live system
(router + PrfaaS prefill + PD-P + PD-D; the deployment is shared with test_serve_live.py).

Every expectation is computed in-process with the engine (same config, same weights): the
tokens `generate` gives with the same sampling parameters, the log-softmax of its logits.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from serve_helpers import MODEL, THRESHOLD_TOKENS, get_text

from needs import import_for
from prfaas.engine import SamplingParams
from prfaas.serve.deploy.launcher import Deployment

pytestmark = pytest.mark.timeout(600)
openai = import_for("openai", "openai")
LONG = "The quick brown fox jumps over the lazy dog. " * 8  # > THRESHOLD_TOKENS: PrfaaS route


@pytest.fixture(scope="module")
def client(live: Deployment) -> Any:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def _extra(obj: Any) -> dict[str, Any]:
    assert obj.model_extra is not None
    extra: dict[str, Any] = obj.model_extra
    return extra


def _metric(url: str, name: str, labels: str) -> float:
    m = re.search(rf"{name}{{{labels}}} (\S+)", get_text(f"{url}/metrics"))
    return float(m.group(1)) if m else 0.0


def _reference_logprobs(engine: Any, ids: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """log-softmax of the logits `generate` samples each of `tokens` from."""
    result = engine.prefill(ids)
    seq = engine.start(result.kv, result.logits, SamplingParams(ignore_eos=True), ids)
    rows = [torch.log_softmax(result.logits, -1)]
    for token in tokens[:-1]:
        seq.last_token = token
        rows.append(torch.log_softmax(engine.decode_logits([seq])[0], -1))
    return rows


def test_stop_string_across_tokens_stream_and_not(client: Any, engine: Any) -> None:
    prompt = "Stop sequences are cut on the text a client sees."
    free_ids = engine.generate(engine.tokenizer.encode(prompt), 24)
    free = engine.tokenizer.decode(free_ids)
    assert len(free) > 12
    stop = free[6:9]  # three characters, one token each at least: the match spans tokens
    expected = free[:free.index(stop)]
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                      stop=[stop, "never-seen"])
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                            temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # the decode worker stopped the sequence too, soon after the stop string's bytes
    generated = _extra(whole)["prfaas"]["token_ids"]
    assert len(generated) < len(free_ids) and generated == free_ids[:len(generated)]
    assert stop in engine.tokenizer.decode(generated)


def test_logprobs_equal_log_softmax_of_generate(client: Any, engine: Any) -> None:
    ids = engine.tokenizer.encode(LONG)
    reply = client.completions.create(model=MODEL, prompt=LONG, max_tokens=6, temperature=0,
                                      logprobs=3, extra_body={"ignore_eos": True})
    assert _extra(reply)["prfaas"]["route"] == "prfaas"
    tokens = engine.generate(ids, 6, SamplingParams(ignore_eos=True))
    assert _extra(reply)["prfaas"]["token_ids"] == tokens
    ref = _reference_logprobs(engine, ids, tokens)
    lp = reply.choices[0].logprobs
    assert lp.token_logprobs == [float(r[t]) for r, t in zip(ref, tokens, strict=True)]
    for row, top in zip(ref, lp.top_logprobs, strict=True):
        best = torch.argsort(row, descending=True)[:3].tolist()
        assert sorted(top.values(), reverse=True)[:3] == [float(row[i]) for i in best]
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    chat_ids = _extra(chat)["prfaas"]["token_ids"]
    chat_prompt = engine.tokenizer.encode("<|user|>\nhi\n<|assistant|>\n")
    ref = _reference_logprobs(engine, chat_prompt, chat_ids)
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == [float(r[t]) for r, t in zip(ref, chat_ids,
                                                                        strict=True)]
    assert all(len(c.top_logprobs) == 2 and c.bytes == [t] for c, t in zip(content, chat_ids,
                                                                           strict=True))


def test_echo_logprobs_prfaas_route_equal_local_prefill(client: Any, live: Deployment,
                                                        engine: Any) -> None:
    ids = engine.tokenizer.encode(LONG)
    assert len(ids) > THRESHOLD_TOKENS
    reply = client.completions.create(model=MODEL, prompt=LONG, max_tokens=0, echo=True,
                                      logprobs=1, temperature=0)
    assert _extra(reply)["prfaas"]["route"] == "prfaas"
    assert reply.choices[0].text == LONG and reply.usage.completion_tokens == 0
    logits = engine.prefill(ids, all_logits=True).prompt_logits  # a local prefill
    ref = torch.log_softmax(logits, -1)
    lp = reply.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
    assert lp.token_logprobs[1:] == [float(ref[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    short = client.completions.create(model=MODEL, prompt="echo me", max_tokens=2, echo=True,
                                      logprobs=0, temperature=0)
    assert _extra(short)["prfaas"]["route"] == "pd" and short.choices[0].text.startswith(
        "echo me")
    short_ids = engine.tokenizer.encode("echo me")
    ref = torch.log_softmax(engine.prefill(short_ids, all_logits=True).prompt_logits, -1)
    assert short.choices[0].logprobs.token_logprobs[1:len(short_ids)] == [
        float(ref[i, short_ids[i + 1]]) for i in range(len(short_ids) - 1)]


def test_n3_shares_one_prefill(client: Any, live: Deployment, engine: Any) -> None:
    prompt = LONG + " n=3"
    ids = engine.tokenizer.encode(prompt)
    transfers = _metric(live.url, "prfaas_kv_transfers_total", 'link="inter_dc"')
    sent = _metric(live.url, "prfaas_kv_bytes_total", 'link="inter_dc"')
    reply = client.completions.create(model=MODEL, prompt=prompt, n=3, max_tokens=8,
                                      temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    prfaas = _extra(reply)["prfaas"]
    assert prfaas["route"] == "prfaas"
    assert _metric(live.url, "prfaas_kv_transfers_total", 'link="inter_dc"') == transfers + 1
    assert _metric(live.url, "prfaas_kv_bytes_total", 'link="inter_dc"') == sent + prfaas[
        "kv_bytes"]
    params = SamplingParams(temperature=1.0, seed=5, ignore_eos=True)
    expected = [engine.tokenizer.decode(engine.generate(ids, 8, params.for_sequence(i)))
                for i in range(3)]
    assert [c.text for c in reply.choices] == expected and len(set(expected)) == 3
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == 24


def test_penalties_change_output_deterministically(client: Any, engine: Any) -> None:
    prompt = "hello hello hello hello"
    ids = engine.tokenizer.encode(prompt)
    kw: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0}
    plain = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    pen = {"frequency_penalty": 2.0, "presence_penalty": 0.5}
    extra = {"ignore_eos": True, "repetition_penalty": 1.3}
    a = client.completions.create(**kw, **pen, extra_body=extra).choices[0].text
    b = client.completions.create(**kw, **pen, extra_body=extra).choices[0].text
    expected = engine.generate(ids, 20, SamplingParams(
        ignore_eos=True, frequency_penalty=2.0, presence_penalty=0.5, repetition_penalty=1.3))
    assert a == b == engine.tokenizer.decode(expected) and a != plain


def test_usage_and_bad_values(client: Any) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="usage please", max_tokens=3,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.prompt_tokens == len("usage please") + 1
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])
    for kwargs, param in (({"extra_body": {"top_k": 0}}, "top_k"),
                          ({"presence_penalty": 3.0}, "presence_penalty"),
                          ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                          ({"logprobs": 21}, "logprobs"), ({"suffix": "x"}, "suffix")):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2, **kwargs)
        assert info.value.body["param"] == param  # type: ignore[index]
