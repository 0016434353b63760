"""A decode instance's `kv_transfer_params` at the end of its completion stream (API server).

vLLM puts what the connector's `request_finished` returned (`kv_transfer_params`) in a
non-streamed completion's body only; a streamed one drops it. The router streams from the
decode instance, and that instance's count of the bytes its KV took on the wire is known when
the load finishes, before its first token (scheduler_half.py). `install()` wraps vLLM's
`OpenAIServingCompletion.completion_stream_generator` so that, when the request's outputs
carried prfaas params, one more SSE event `{"kv_transfer_params": {"prfaas": {...}}}` goes out
just before `[DONE]`; every other event is vLLM's, unchanged. It runs in the API server process
(launch.py, for every instance that receives KV). A vLLM whose generator no longer takes a
`result_generator` fails the start with one line, never a stream silently without the count.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.params import KEY

DONE = "data: [DONE]"
_MARK = "_prfaas_stream_params"


def params_event(params: dict[str, Any]) -> str:
    """The SSE event that carries a request's prfaas params."""
    return f"data: {json.dumps({'kv_transfer_params': {KEY: params}})}\n\n"


async def _tap(results: AsyncIterator[Any], seen: dict[str, Any]) -> AsyncIterator[Any]:
    """The engine's outputs, unchanged; the prfaas params of any of them kept in `seen`."""
    async for item in results:
        out = item[1] if isinstance(item, tuple) else item
        params = getattr(out, "kv_transfer_params", None)
        if isinstance(params, dict) and isinstance(params.get(KEY), dict):
            seen.update(params[KEY])
        yield item


def install(cls: type | None = None) -> None:
    """Patch `cls.completion_stream_generator` (vLLM's OpenAIServingCompletion by default;
    a test passes its own class). Idempotent."""
    if cls is None:
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
        cls = OpenAIServingCompletion
    original = cls.completion_stream_generator  # type: ignore[attr-defined, union-attr, unused-ignore]
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)
    if "result_generator" not in signature.parameters:
        raise ConfigError("vllm completion_stream_generator", cls.__name__,
                          "takes no result_generator (vLLM changed): a decode instance could "
                          "not report its KV's wire bytes")

    async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[str]:
        bound = signature.bind(*args, **kwargs)
        seen: dict[str, Any] = {}
        bound.arguments["result_generator"] = _tap(bound.arguments["result_generator"], seen)
        async for chunk in original(*bound.args, **bound.kwargs):
            if chunk.startswith(DONE) and seen:
                yield params_event(seen)
            yield chunk

    setattr(stream, _MARK, True)
    cls.completion_stream_generator = stream  # type: ignore[attr-defined, union-attr, unused-ignore]
