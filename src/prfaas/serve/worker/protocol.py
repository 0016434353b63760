"""The router <-> worker control protocol (JSON over HTTP; docs/serving.md has the full table).

Prefill worker: `POST /prefill` {request_id, token_ids, ship_from_tokens, dest: {host, port}}
-> {first_token, cached_tokens, computed_tokens, kv_bytes, prefill_s, queue_s, transfer_s,
cache: {inserted, evicted}} or an error {error: {type, message}} (400 bad body, 502 transfer
failed). Decode worker: `POST /generate` {request_id, token_ids, max_tokens, sampling} ->
NDJSON lines: {"event": "ready", cached_tokens}, {"event": "token", id}*, then
{"event": "done", finish_reason, ...} or {"event": "error", message}; `POST /cancel`
{request_id}. Both: `GET /health`, `GET /status`. Helpers here validate bodies and build
error replies; no engine, no torch.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from prfaas.core.errors import PrfaasError


class ProtocolError(PrfaasError):
    """A control message is malformed; names the field and the value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        shown = repr(value)
        super().__init__(f"{field}={shown[:80]}: {reason}")


def error_reply(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


async def read_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError("body", "<unparsable>", f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("body", body, "must be a JSON object")
    return body


def get_int(body: dict[str, Any], key: str, minimum: int = 0, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(key, value, "must be an integer")
    if value < minimum:
        raise ProtocolError(key, value, f"must be >= {minimum}")
    return value


def get_tokens(body: dict[str, Any], key: str = "token_ids") -> list[int]:
    value = body.get(key)
    if not isinstance(value, list) or not value:
        raise ProtocolError(key, value, "must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ProtocolError(key, value[:5], "token ids must be integers")
    return value


def line(payload: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return (json.dumps(payload, separators=(",", ":")) + "\n").encode()
