"""OpenAI parameters in-process: every field of the official client is handled or refused,
bad values name the field, stop strings across token boundaries, logprob shapes."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from serve_helpers import MODEL

from prfaas.engine import ByteTokenizer
from prfaas.serve.router import openai_params as op
from prfaas.serve.router.choices import Choice, completion_logprobs, prompt_entries
from prfaas.serve.router.openai_api import ApiError, GenRequest, parse
from prfaas.serve.router.respond import Reply
from prfaas.serve.stops import StopText

TOK = ByteTokenizer()
BASE = {"completions": {"model": MODEL, "prompt": "hi", "max_tokens": 8},
        "chat": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "max_tokens": 8}}
# a non-default value of every handled field, with what else it needs in the body
VALUES: dict[str, tuple[object, dict[str, Any]]] = {
    "model": (MODEL, {}), "prompt": ("other", {}), "messages": ([{"role": "user",
                                                                  "content": "x"}], {}),
    "stream": (True, {}), "stream_options": ({"include_usage": True}, {"stream": True}),
    "max_tokens": (5, {}), "max_completion_tokens": (5, {}), "temperature": (0.5, {}),
    "top_p": (0.5, {}), "seed": (7, {}), "stop": (["\n"], {}), "n": (2, {}),
    "presence_penalty": (1.0, {}), "frequency_penalty": (1.0, {}),
    "logit_bias": ({"65": 5}, {}), "logprobs": (2, {}), "echo": (True, {}),
    "best_of": (3, {}), "top_logprobs": (3, {"logprobs": True}),
    "top_k": (5, {}), "min_p": (0.1, {}), "repetition_penalty": (1.2, {}),
    "min_tokens": (2, {}), "stop_token_ids": ([10], {}), "ignore_eos": (True, {}),
}


def _parse(body: dict[str, Any], chat: bool = False) -> GenRequest:
    return parse(body, chat, MODEL, 16384, TOK)


def _client_fields(route: str) -> set[str]:
    if route == "chat":
        from openai.types.chat import completion_create_params as mod
    else:
        from openai.types import completion_create_params as mod
    fields = set(typing.get_type_hints(mod.CompletionCreateParamsBase))
    return fields | set(typing.get_type_hints(mod.CompletionCreateParamsStreaming))


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_every_client_field_is_handled_or_refused(route: str) -> None:
    pytest.importorskip("openai")
    fields = _client_fields(route)
    assert len(fields) > 15  # the enumeration found the client's fields
    known = op.HANDLED[route] | op.METADATA | set(op.REFUSED)
    assert fields - known == set(), "fields of the openai client with no decision"
    chat = route == "chat"
    for field in sorted(fields & set(op.REFUSED)):
        with pytest.raises(ApiError) as info:
            _parse({**BASE[route], field: "on"}, chat)
        assert info.value.status == 400 and info.value.param == field
    for field in sorted((fields & op.HANDLED[route]) | op.EXTENSIONS):
        value, needs = (True, {}) if (chat, field) == (True, "logprobs") else VALUES[field]
        base = _parse({**BASE[route], **needs}, chat)
        if field == "model":
            continue
        changed = _parse({**BASE[route], **needs, field: value}, chat)
        assert changed != base, f"'{field}' accepted without effect"


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ApiError) as info:
        _parse({**BASE["completions"], "temprature": 0.5})
    assert info.value.param == "temprature" and "unknown" in info.value.message


@pytest.mark.parametrize(("extra", "param"), [
    ({"top_k": 0}, "top_k"), ({"top_k": -2}, "top_k"), ({"presence_penalty": 2.5},
                                                        "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"), ({"repetition_penalty": 0},
                                                         "repetition_penalty"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"logprobs": 21}, "logprobs"),
    ({"min_p": 2}, "min_p"), ({"best_of": 1, "n": 2}, "best_of"), ({"n": 17}, "n"),
    ({"logit_bias": {"999": 1}}, "logit_bias"), ({"echo": True, "stream": True}, "echo"),
    ({"min_tokens": 9}, "min_tokens"), ({"stream_options": {"include_usage": True}},
                                        "stream_options"),
    ({"stop_token_ids": [258]}, "stop_token_ids"), ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_values_are_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse({**BASE["completions"], **extra})
    assert info.value.status == 400 and info.value.param == param, info.value.message


def test_chat_logprob_limits() -> None:
    for extra, param in (({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                         ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 3}, "logprobs")):
        with pytest.raises(ApiError) as info:
            _parse({**BASE["chat"], **extra}, chat=True)
        assert info.value.param == param
    assert _parse({**BASE["chat"], "logprobs": True}, chat=True).logprobs == 0


def test_echo_allows_max_tokens_zero_and_sampling_dict() -> None:
    req = _parse({**BASE["completions"], "echo": True, "logprobs": 1, "max_tokens": 0})
    assert req.max_tokens == 0 and req.prompt_text == "hi"
    assert req.sampling()["prompt_logprobs"] == 1
    plain = _parse(BASE["completions"]).sampling()
    assert set(plain) == {"temperature", "top_p", "ignore_eos"}  # old keys only
    # a seed goes to the workers only when the client sent one (vLLM then samples unseeded,
    # as its own server does; prfaas' workers default to seed 0 either way)
    assert _parse({**BASE["completions"], "seed": 0}).sampling()["seed"] == 0


def _feed(stops: tuple[str, ...], text: bytes, min_tokens: int = 0) -> tuple[list[str], StopText]:
    st = StopText(stops, min_tokens)
    return [st.feed(b) for b in text], st


def test_stop_string_across_tokens_is_cut_and_held_back() -> None:
    out, st = _feed(("STOP",), b"abSTxSTOPzz")
    assert "".join(out) == "abSTx" and st.stopped and st.matched == "STOP"
    assert out[:5] == ["a", "b", "", "", "STx"]  # "S", "ST" held: they could begin "STOP"
    out, st = _feed(("\u00e9t\u00e9",), "caf\u00e9 \u00e9t\u00e9 !".encode())
    assert "".join(out) == "caf\u00e9 " and st.stopped  # 2-byte characters matched whole
    out, st = _feed(("ab",), b"abcab", min_tokens=3)
    assert "".join(out) == "abc" and st.stopped  # not looked for before min_tokens tokens
    out, st = _feed(("zz",), b"hello z")
    assert "".join(out) + st.flush() == "hello z" and not st.stopped


def test_choice_drops_logprobs_of_the_stop_string() -> None:
    choice = Choice.new(0, ("cd",), 0)
    released = []
    for i, b in enumerate(b"abcde"):
        released += choice.feed(b, -float(i))[1]
    assert choice.full_text == "ab" and choice.stopped and choice.num_tokens == 5
    lp = completion_logprobs(released)
    assert lp["tokens"] == ["a", "b"] and lp["text_offset"] == [0, 1]
    assert lp["token_logprobs"] == [-0.0, -1.0]


def test_echo_entries_and_best_of_ranking() -> None:
    ids = TOK.encode("h\u00e9")  # BOS, h, 2 bytes
    entries = prompt_entries(ids, [[-1.0, [[104, -1.0]]], [-2.0, []], [-3.0, []]])
    lp = completion_logprobs(entries)
    assert lp["tokens"] == ["<|bos|>", "h", "bytes:\\xc3", "bytes:\\xa9"]
    assert lp["token_logprobs"] == [None, -1.0, -2.0, -3.0] and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [0, 0, 1, 1]
    req = _parse({**BASE["completions"], "n": 1, "best_of": 3, "logprobs": 0})
    reply = Reply(req, "cmpl-x")
    for seq, lps in enumerate(([-3.0, -3.0], [-0.5, -0.5], [-1.0, -2.0])):
        for t, v in zip(b"xy", lps, strict=True):
            reply.token(seq, t, v)
    reply.finish()
    body = reply.whole(reply.usage(0), None)
    assert len(body["choices"]) == 1 and body["choices"][0]["logprobs"]["token_logprobs"] == [
        -0.5, -0.5]
    assert body["usage"]["completion_tokens"] == 6  # every sequence's tokens count


def test_stream_chunks_of_two_choices_and_chat_role() -> None:
    req = _parse({**BASE["chat"], "n": 2, "stream": True, "logprobs": True, "top_logprobs": 1},
                 chat=True)
    reply = Reply(req, "chatcmpl-x")
    first = reply.token(1, ord("a"), -0.5, ((98, -0.1),))
    assert first[0]["choices"][0]["index"] == 1
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    entry = first[0]["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == "a" and entry["bytes"] == [97]
    assert entry["top_logprobs"] == [{"token": "b", "logprob": -0.1, "bytes": [98]}]
    assert reply.token(1, ord("b"), -0.2)[0]["choices"][0]["delta"] == {"content": "b"}
    closing = reply.finish()
    assert [c["choices"][0]["index"] for c in closing] == [0, 1]
    assert closing[0]["choices"][0]["delta"] == {"role": "assistant"}  # choice 0 got nothing
    assert [c["choices"][0]["finish_reason"] for c in closing] == ["stop", "stop"]
    with pytest.raises(ValueError):
        reply.token(2, 65, 0.0)


def test_decode_worker_reads_old_and_new_sampling_dicts() -> None:
    from prfaas.serve.worker.decode_worker import sampling_from
    from prfaas.serve.worker.protocol import ProtocolError

    params, n, stops, offset = sampling_from({"temperature": 0.5, "top_p": 0.9, "seed": 3,
                                              "ignore_eos": True})
    assert (params.temperature, params.top_p, params.seed, params.ignore_eos) == (
        0.5, 0.9, 3, True) and (n, stops, offset) == (1, (), 0)
    req = _parse({**BASE["completions"], "top_k": 4, "stop": ["x"], "n": 2, "logprobs": 2,
                  "presence_penalty": 1.0, "logit_bias": {"7": -5}})
    params, n, stops, _ = sampling_from(req.sampling())
    assert (params.top_k, params.logprobs, params.presence_penalty, params.logit_bias) == (
        4, 2, 1.0, ((7, -5.0),)) and (n, stops) == (2, ("x",))
    with pytest.raises(ProtocolError, match="top_k"):
        sampling_from({"top_k": 0})


def test_events_without_what_the_request_needs_are_502() -> None:
    from prfaas.serve.router.backends import TokenEvent
    from prfaas.serve.router.respond import feed

    req = _parse({**BASE["completions"], "logprobs": 2, "n": 2})
    reply = Reply(req, "cmpl-x")
    ok = feed(reply, TokenEvent(65, {"lp": -1.0, "top": [[65, -1.0], [66, -2.0]], "seq": 1}))
    assert ok[0]["choices"][0]["logprobs"]["token_logprobs"] == [-1.0]
    for extra in ({"top": [[65, -1.0]], "seq": 0}, {"lp": -1.0, "seq": 0},
                  {"lp": -1.0, "top": [[65, -1.0]]}):
        with pytest.raises(ApiError) as info:
            feed(reply, TokenEvent(65, extra))
        assert info.value.status == 502
    plain = Reply(_parse(BASE["completions"]), "cmpl-y")
    assert feed(plain, TokenEvent(65))[0]["choices"][0]["text"] == "A"


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_puts_usage_in_every_chunk(chat: bool) -> None:
    """vLLM's `continuous_usage_stats` (guidellm always sends it): every chunk carries the
    prompt's tokens and its choice's tokens so far; without it no chunk does (the control)."""
    route = "chat" if chat else "completions"
    for continuous in (True, False):
        opts = {"include_usage": True, "continuous_usage_stats": continuous}
        req = _parse({**BASE[route], "n": 2, "stream": True, "stream_options": opts}, chat)
        assert (req.include_usage, req.continuous_usage) == (True, continuous)
        reply = Reply(req, "x")
        chunks = [*reply.token(0, ord("a"), 0.0), *reply.token(1, ord("b"), 0.0),
                  *reply.token(0, 0xC3, 0.0),  # half a character: a chunk without text
                  *reply.token(0, 0xA9, 0.0), *reply.finish()]
        usages = [(c["choices"][0]["index"], c.get("usage")) for c in chunks]
        if not continuous:
            assert all(u is None for _, u in usages)
            continue
        n_in = len(req.token_ids)
        assert [(i, u["completion_tokens"]) for i, u in usages] == [
            (0, 1), (1, 1), (0, 2), (0, 3), (0, 3), (1, 1)]
        assert all(u["prompt_tokens"] == n_in and u["total_tokens"] == n_in + u[
            "completion_tokens"] for _, u in usages)


@pytest.mark.parametrize(("opts", "needle"), [
    ({"include_usage": True, "bogus": True}, "stream_options.bogus"),
    ({"continuous_usage_stats": True}, "needs 'include_usage'"),
    ({"include_usage": "yes"}, "must be a boolean"),
    ({"include_usage": True, "include_obfuscation": True}, "include_obfuscation"),
    ("on", "must be an object"),
])
def test_bad_stream_options_are_400_naming_the_option(opts: object, needle: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse({**BASE["completions"], "stream": True, "stream_options": opts})
    assert info.value.status == 400 and info.value.param == "stream_options"
    assert needle in info.value.message


def test_neutral_stream_options_are_accepted() -> None:
    req = _parse({**BASE["completions"], "stream": True, "stream_options": {
        "include_usage": False, "continuous_usage_stats": False, "include_obfuscation": False}})
    assert (req.include_usage, req.continuous_usage) == (False, False)
