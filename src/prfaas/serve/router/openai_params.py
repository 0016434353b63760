"""Which OpenAI request fields the router honours, which it refuses, and their validation.

Every top-level key of a request must be in one of these tables: HANDLED (changes what is
generated or returned), METADATA (identifiers that by OpenAI's own definition do not change
the output), EXTENSIONS (vLLM's extra sampling fields), or REFUSED (400 naming the field
unless its value is the neutral one listed, e.g. `store: false`). An unknown key is a 400 too,
so nothing is accepted and silently ignored. `tests/serve/test_openai_params.py` enumerates the
installed `openai` client's request fields against these tables.
"""

from __future__ import annotations

from typing import Any

from prfaas.models.card import MAX_LOGPROBS

MAX_STOP = 4  # as OpenAI
MAX_N = 16

COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
          "stop", "n", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs"}
HANDLED = {"completions": COMMON | {"prompt", "echo", "best_of"},
           "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs"}}
METADATA = {"user", "safety_identifier"}  # end-user ids for abuse monitoring: no output effect
EXTENSIONS = {"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
              "ignore_eos"}
_ABSENT = (None,)
REFUSED: dict[str, tuple[object, ...]] = {  # field -> values that mean "not used"
    "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": _ABSENT,
    "response_format": (None, {"type": "text"}), "audio": _ABSENT,
    "modalities": (None, ["text"]), "prediction": _ABSENT, "reasoning_effort": _ABSENT,
    "verbosity": _ABSENT, "web_search_options": _ABSENT, "service_tier": (None, "auto"),
    "store": (None, False), "metadata": (None, {}), "moderation": _ABSENT,
    "prompt_cache_key": _ABSENT, "prompt_cache_options": _ABSENT,
    "prompt_cache_retention": _ABSENT,
}


class ParamError(Exception):
    """A request field is unsupported or out of range (the router answers 400 naming it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_keys(body: dict[str, Any], route: str) -> None:
    allowed = HANDLED[route] | METADATA | EXTENSIONS
    for key, value in body.items():
        if key in allowed:
            continue
        if key in REFUSED:
            if value in REFUSED[key]:
                continue
            raise ParamError(key, f"'{key}'={_short(value)} is not supported by this server")
        raise ParamError(key, f"unknown parameter '{key}'")


def number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ParamError(key, f"'{key}'={value!r} must be a number in [{lo}, {hi}]")
    return float(value)


def integer(body: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ParamError(key, f"'{key}'={value!r} must be an integer in [{lo}, {hi}]")
    return value


def top_k(body: dict[str, Any]) -> int:
    value = body.get("top_k")
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        raise ParamError("top_k", f"'top_k'={value!r} must be -1 (all tokens) or an integer >= 1")
    return value


def repetition_penalty(body: dict[str, Any]) -> float:
    value = body.get("repetition_penalty")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1e6:
        raise ParamError("repetition_penalty",
                         f"'repetition_penalty'={value!r} must be a number > 0")
    return float(value)


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ParamError("stop", f"'stop'={_short(value)} must be a string or a list of strings")
    if len(items) > MAX_STOP:
        raise ParamError("stop", f"'stop' has {len(items)} strings; at most {MAX_STOP}")
    if any(not s for s in items):
        raise ParamError("stop", "'stop' strings must not be empty")
    return tuple(items)


def token_ids(body: dict[str, Any], key: str, vocab_size: int) -> tuple[int, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
            for t in value):
        raise ParamError(key, f"'{key}'={_short(value)} must be a list of token ids in "
                              f"[0, {vocab_size})")
    return tuple(value)


def logit_bias(body: dict[str, Any], vocab_size: int) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ParamError("logit_bias", "'logit_bias' must map token ids to biases")
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token < vocab_size or isinstance(bias, bool) or not isinstance(
                bias, int | float) or not -100 <= bias <= 100:
            raise ParamError("logit_bias", f"'logit_bias' entry {key!r}: {bias!r}: token ids in "
                                           f"[0, {vocab_size}), biases in [-100, 100]")
        out.append((token, float(bias)))
    return tuple(sorted(out))


def logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Top alternatives to report per token, or None (no logprobs)."""
    if not chat:
        n = integer(body, "logprobs", -1, 0, MAX_LOGPROBS)
        return None if n < 0 else n
    want = body.get("logprobs")
    if want is not None and not isinstance(want, bool):
        raise ParamError("logprobs", f"'logprobs'={want!r} must be a boolean for chat")
    k = integer(body, "top_logprobs", -1, 0, MAX_LOGPROBS)
    if k >= 0 and not want:
        raise ParamError("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return (max(k, 0)) if want else None


def stream_usage(body: dict[str, Any]) -> tuple[bool, bool]:
    """`stream_options` as vLLM's server reads it: (usage in a closing chunk, usage in every
    chunk). `continuous_usage_stats` (vLLM's extension, which guidellm always sends) reports
    the tokens so far in every chunk; like vLLM it needs `include_usage`, and here asking
    for it without `include_usage` is a 400 rather than silently nothing.
    `include_obfuscation` (OpenAI's) is accepted only as false: nothing is obfuscated."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    known = {"include_usage", "continuous_usage_stats", "include_obfuscation"}
    if not isinstance(opts, dict):
        raise ParamError("stream_options", f"'stream_options'={_short(opts)} must be an object")
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ParamError("stream_options", f"'stream_options.{unknown[0]}' is not supported "
                                           f"(known: {', '.join(sorted(known))})")
    for key in ("include_usage", "continuous_usage_stats", "include_obfuscation"):
        if opts.get(key) is not None and not isinstance(opts[key], bool):
            raise ParamError("stream_options", f"'stream_options.{key}'={_short(opts[key])} "
                                               "must be a boolean")
    if opts.get("include_obfuscation"):
        raise ParamError("stream_options", "'stream_options.include_obfuscation'=True is not "
                                           "supported by this server")
    if not body.get("stream"):
        raise ParamError("stream_options", "'stream_options' needs 'stream': true")
    usage, continuous = bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))
    if continuous and not usage:
        raise ParamError("stream_options", "'stream_options.continuous_usage_stats' needs "
                                           "'include_usage': true (as vLLM)")
    return usage, continuous


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
