"""The one SSE reader (bench.loadgen.sse_payloads*) that the load generator, the live tests
and the probes share: only `data:` objects come out, in order; the closing [DONE], blank
lines and comments do not; a malformed data line raises (the load generator records it as
the request's error)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from prfaas.bench.loadgen import sse_payload, sse_payloads, sse_payloads_async

STREAM = [b'data: {"choices": [{"text": "a"}]}\n', b"\n", b": keep-alive\n",
          b'data: {"choices": [], "prfaas": {"route": "pd"}}\r\n', b"\n",
          b"data: [DONE]\n", b"\n"]
EXPECTED = [{"choices": [{"text": "a"}]}, {"choices": [], "prfaas": {"route": "pd"}}]


def test_sync_reader_yields_the_data_objects_in_order() -> None:
    assert list(sse_payloads(iter(STREAM))) == EXPECTED


def test_async_reader_yields_the_same() -> None:
    async def lines() -> AsyncIterator[bytes]:
        for raw in STREAM:
            yield raw

    async def read() -> list[dict[str, object]]:
        return [p async for p in sse_payloads_async(lines())]

    assert asyncio.run(read()) == EXPECTED


def test_negative_control_malformed_data_raises() -> None:
    assert sse_payload(b"data: [DONE]\n") is None
    with pytest.raises(ValueError):
        sse_payload(b'data: {"choices": \n')
