"""API-key middleware without a deployment: which paths are open, constant-time check, the
OpenAI-style 401 body, and `metrics: protected`."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prfaas.security.apikey import api_key_middleware, bearer_ok, check_key
from prfaas.security.spec import parse_security

KEY = "sk-unit-0123456789"


def _calls(protect_metrics: bool, header: str | None) -> dict[str, int]:
    refused: list[int] = []

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def body() -> dict[str, int]:
        app = web.Application(middlewares=[api_key_middleware(
            KEY, protect_metrics, lambda: refused.append(1))])
        app.add_routes([web.get(p, ok) for p in ("/health", "/metrics", "/v1/models")])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        out: dict[str, int] = {}
        headers = {"Authorization": header} if header else {}
        async with aiohttp.ClientSession() as s:
            for path in ("/health", "/metrics", "/v1/models"):
                async with s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
                    out[path] = r.status
                    if r.status == 401:
                        err: Any = (await r.json())["error"]
                        assert err["code"] == "invalid_api_key" and err["param"] is None
        await runner.cleanup()
        out["refused"] = len(refused)
        return out

    return asyncio.run(asyncio.wait_for(body(), 30))


@pytest.mark.parametrize(("protect", "header", "want"), [
    (False, None, {"/health": 200, "/metrics": 200, "/v1/models": 401, "refused": 1}),
    (False, "Bearer sk-wrong-000000", {"/health": 200, "/metrics": 200, "/v1/models": 401,
                                       "refused": 1}),
    (False, f"Bearer {KEY}", {"/health": 200, "/metrics": 200, "/v1/models": 200, "refused": 0}),
    (True, None, {"/health": 200, "/metrics": 401, "/v1/models": 401, "refused": 2}),
    (True, f"Bearer {KEY}", {"/health": 200, "/metrics": 200, "/v1/models": 200, "refused": 0}),
])
def test_paths_open_and_protected(protect: bool, header: str | None,
                                  want: dict[str, int]) -> None:
    assert _calls(protect, header) == want


def test_bearer_parsing_and_key_rules() -> None:
    assert bearer_ok(f"Bearer {KEY}", KEY)
    assert not bearer_ok(KEY, KEY) and not bearer_ok(f"Basic {KEY}", KEY)
    assert not bearer_ok(f"Bearer {KEY}x", KEY) and not bearer_ok(None, KEY)
    with pytest.raises(ValueError, match="8 printable"):
        check_key("has space in it", "--api-key")


def test_security_section_parsing(tmp_path: Any) -> None:
    on = parse_security({"tls": {"dir": "c"}}, tmp_path, ["127.0.0.1"], ["127.0.0.1"])
    assert on.tls_dir == str(tmp_path / "c") and on.metrics == "open"
    assert not parse_security(None, tmp_path, ["127.0.0.1"], ["127.0.0.1"]).tls
    assert parse_security(None, tmp_path, ["10.0.0.2"], ["127.0.0.1"]).tls  # remote: on
    assert not parse_security({"tls": False}, tmp_path, ["10.0.0.2"], ["127.0.0.1"]).tls
    with pytest.raises(ValueError, match=r"security\.metrics"):
        parse_security({"metrics": "sometimes"}, tmp_path, [], [])
    with pytest.raises(ValueError, match="unknown key"):
        parse_security({"tsl": False}, tmp_path, [], [])
