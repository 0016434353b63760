"""API keys on the router: `Authorization: Bearer KEY`, compared in constant time.

`prfaas serve --api-key KEY` or the PRFAAS_API_KEY environment variable (as vLLM's --api-key).
Every path needs the key except `/health` (load balancers probe it) and, unless the topology
says `security: {metrics: protected}` (or `--protect-metrics`), `/metrics`. A missing or wrong
key is 401 with an OpenAI-style error object, so the official client raises AuthenticationError.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from prfaas.core.errors import ConfigError

ENV = "PRFAAS_API_KEY"
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key_from_env() -> str | None:
    key = os.environ.get(ENV)
    return check_key(key, ENV) if key else None


def check_key(key: str, where: str) -> str:
    if len(key) < 8 or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(where, "<hidden>", "an API key needs >= 8 printable characters, "
                          "no spaces")
    return key


def bearer_ok(header: str | None, key: str) -> bool:
    """Whether `header` is `Bearer KEY`; compare_digest: the time taken says nothing of KEY."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), key.encode())


def unauthorized(message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": "invalid_api_key"}}
    return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})


def api_key_middleware(key: str, protect_metrics: bool,
                       on_refused: Callable[[], None] | None = None) -> Middleware:
    open_paths = {"/health"} | (set() if protect_metrics else {"/metrics"})

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        header = request.headers.get("Authorization")
        if not bearer_ok(header, key):
            if on_refused is not None:
                on_refused()
            what = "no API key" if not header else "incorrect API key"
            return unauthorized(f"{what} provided: send Authorization: Bearer <key>")
        return await handler(request)

    return middleware
