"""OpenAI-compatible request parsing for the router (the replies: respond.py).

`parse` validates a completions or chat body into a `GenRequest` or raises `ApiError`
(HTTP 400 with an OpenAI-style error object: message, type, param, code). Chat messages are
rendered with a fixed byte-level template (`<|role|>\\n content \\n ... <|assistant|>\\n`).
Limits follow `Engine.generate`: prompt tokens <= context, prompt + max_tokens <= context + 1.
Which fields are honoured and which refused: openai_params.py (nothing is silently ignored).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prfaas.models.tokenizer import ByteTokenizer
from prfaas.serve.router import openai_params as op
from prfaas.serve.router.openai_params import ParamError

DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (status, message, param,
                                                                       kind, code)
        self.retry_after_s = retry_after_s  # a Retry-After header (429 full, 503 no path)

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True, slots=True)
class GenRequest:
    chat: bool
    model: str
    token_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stream: bool
    ignore_eos: bool
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # top alternatives per token; None = no logprobs
    echo: bool = False
    prompt_text: str = ""  # the prompt as text (echo)
    n: int = 1
    best_of: int = 1  # sequences generated (>= n); the n with the highest logprob are returned
    # the client sent `seed`: only then is it passed on. Without one prfaas' workers draw with
    # seed 0 (their default) and vLLM unseeded, as its own server does (a seeded vLLM-CPU
    # request whose prefill is chunked crashes its engine: docs/clients.md)
    seed_given: bool = False
    include_usage: bool = False  # a closing usage chunk (stream_options.include_usage)
    continuous_usage: bool = False  # usage in every chunk (stream_options.continuous_usage_stats)

    def sampling(self) -> dict[str, Any]:
        """The /generate `sampling` dict (the decode worker reads it)."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                               "ignore_eos": self.ignore_eos}
        if self.seed_given:
            out["seed"] = self.seed
        extra: dict[str, Any] = {
            "top_k": self.top_k, "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "min_tokens": self.min_tokens,
            "logit_bias": [list(p) for p in self.logit_bias], "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids), "logprobs": self.logprobs,
            "n": self.best_of,
            "prompt_logprobs": self.logprobs if self.echo and self.logprobs is not None else None}
        defaults = {"top_k": -1, "min_p": 0.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                    "n": 1}
        out.update({k: v for k, v in extra.items() if v not in (None, [], defaults.get(k))})
        return out


def load_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body


def chat_prompt(messages: object) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required: a non-empty list", param="messages",
                       code="missing_messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] needs a 'role' string", param="messages")
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def _check_model(body: dict[str, Any], model_name: str, required: bool = True) -> None:
    model = body.get("model")
    if model is None and not required:
        return
    if model != model_name:
        raise ApiError(400, f"model {model!r} does not exist; this server serves "
                            f"{model_name!r} (its tokenizer folder: `prfaas tokenizer --out "
                            "DIR`)", param="model", code="model_not_found")


def tokenize(body: dict[str, Any], model_name: str, tokenizer: ByteTokenizer) -> list[int]:
    """`/tokenize` (vLLM's): the ids a completions `prompt` or chat `messages` count as."""
    _check_model(body, model_name, required=False)
    allowed = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unknown parameter '{unknown[0]}'", param=unknown[0])
    if body.get("add_special_tokens", True) is not True or body.get(
            "add_generation_prompt", True) is not True:
        raise ApiError(400, "only the router's own counting is offered: add_special_tokens "
                            "and add_generation_prompt true", param="add_special_tokens")
    if "messages" in body:
        return tokenizer.encode(chat_prompt(body["messages"]))
    if not isinstance(body.get("prompt"), str):
        raise ApiError(400, "'prompt' (a string) or 'messages' is required", param="prompt")
    return tokenizer.encode(body["prompt"])


def detokenize(body: dict[str, Any], model_name: str, tokenizer: ByteTokenizer) -> str:
    _check_model(body, model_name, required=False)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokenizer.vocab_size
            for t in ids):
        raise ApiError(400, f"'tokens' must be a list of token ids in [0, "
                            f"{tokenizer.vocab_size})", param="tokens")
    return tokenizer.decode(ids)


def _prompt_ids(body: dict[str, Any], tokenizer: ByteTokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise ApiError(400, f"prompt token ids {bad[:5]} outside [0, {tokenizer.vocab_size})"
                                ": they come from another tokenizer than this model's "
                                "(`prfaas tokenizer --out DIR` writes it)", param="prompt",
                           code="token_id_out_of_vocab")
        return list(prompt)
    if prompt is None:
        raise ApiError(400, "'prompt' is required", param="prompt", code="missing_prompt")
    raise ApiError(400, "'prompt' must be a string, a list of one string or a list of token ids",
                   param="prompt")


def parse(body: dict[str, Any], chat: bool, model_name: str, context_tokens: int,
          tokenizer: ByteTokenizer) -> GenRequest:
    try:
        return _parse(body, chat, model_name, context_tokens, tokenizer)
    except ParamError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc


def _parse(body: dict[str, Any], chat: bool, model_name: str, context_tokens: int,
           tokenizer: ByteTokenizer) -> GenRequest:
    _check_model(body, model_name)
    model = model_name
    op.check_keys(body, "chat" if chat else "completions")
    ids = tokenizer.encode(chat_prompt(body.get("messages"))) if chat else _prompt_ids(
        body, tokenizer)
    if len(ids) > context_tokens:
        raise ApiError(400, f"the prompt is {len(ids)} tokens, longer than the context of "
                            f"{context_tokens} tokens", param="prompt" if not chat else "messages",
                       code="context_length_exceeded")
    stream, echo = bool(body.get("stream")), bool(body.get("echo"))
    if echo and stream:
        raise ParamError("echo", "'echo' is supported without 'stream' only")
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(key)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < (
            0 if echo else 1):
        raise ApiError(400, f"'{key}'={max_tokens!r} must be a positive integer (0 allowed "
                            "with echo)", param=key)
    if len(ids) + max_tokens > context_tokens + 1:
        raise ApiError(400, f"'{key}'={max_tokens} plus the {len(ids)}-token prompt is beyond "
                            f"the context of {context_tokens} tokens", param=key,
                       code="context_length_exceeded")
    seed = op.integer(body, "seed", 0, 0, 2**62)
    n = op.integer(body, "n", 1, 1, op.MAX_N)
    best_of = op.integer(body, "best_of", n, n, op.MAX_N)
    if best_of > n and stream:
        raise ParamError("best_of", "'best_of' > n cannot be streamed")
    min_tokens = op.integer(body, "min_tokens", 0, 0, max_tokens)
    vocab = tokenizer.vocab_size
    usage, continuous = op.stream_usage(body)
    return GenRequest(
        chat, model, ids, max_tokens, op.number(body, "temperature", 1.0, 0.0, 2.0),
        op.number(body, "top_p", 1.0, 1e-9, 1.0), seed, stream,
        bool(body.get("ignore_eos", False)), top_k=op.top_k(body),
        min_p=op.number(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=op.number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=op.number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=op.repetition_penalty(body), min_tokens=min_tokens,
        logit_bias=op.logit_bias(body, vocab), stop=op.stop_strings(body),
        stop_token_ids=op.token_ids(body, "stop_token_ids", vocab),
        logprobs=op.logprobs(body, chat), echo=echo,
        prompt_text=tokenizer.decode(ids) if echo else "", n=n, best_of=best_of,
        include_usage=usage, continuous_usage=continuous,
        seed_given=body.get("seed") is not None)
