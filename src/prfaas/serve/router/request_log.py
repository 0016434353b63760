"""The router's per-request log: one JSON line per request, appended as each one ends.

Turned on by `prfaas serve --request-log PATH` (the router process reads PRFAAS_REQUEST_LOG).
A line holds what a benchmark client measures of the same request, so the two can be joined
(`id` is the response's id, `x_request_id` the client's X-Request-Id header) and compared:

- `status`: the HTTP status (200, or the 4xx/5xx of a refused or failed request; null: the
  client went away or the router failed mid-stream), `error` and `param` when not 200;
- `prompt_tokens` (the router's own count), `completion_tokens` (every sequence's);
- `ttft_s`: request received -> the first token from the workers (the router's TTFT, as in
  its `prfaas_ttft_seconds` histogram and the response's `prfaas.ttft_s`);
- `first_text_s` (streaming): request received -> the first chunk with text written to the
  client. A client's TTFT ends here: a token that is part of a UTF-8 character, or held
  back by a stop string, reaches the client with the next one;
- `e2e_s`, `route` (pd / prfaas), `cached_tokens`, `retried`, `resumed`.

Times are the router's monotonic clock from the moment its handler starts (the request's
headers have arrived); `start_unix_s` is wall-clock time at that moment.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web


def has_text(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries generated text (completions `text`, chat `content`)."""
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


@dataclass(slots=True)
class Entry:
    endpoint: str
    start_unix_s: float
    x_request_id: str | None = None
    id: str | None = None
    model: str | None = None
    stream: bool | None = None
    status: int | None = None
    error: str | None = None
    param: str | None = None
    route: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    ttft_s: float | None = None
    first_text_s: float | None = None
    e2e_s: float | None = None
    cached_tokens: int | None = None
    retried: bool = False
    resumed: int = 0

    @classmethod
    def start(cls, request: web.Request, chat: bool) -> Entry:
        return cls("chat" if chat else "completions", time.time(),
                   request.headers.get("X-Request-Id"))

    def refused(self, exc: Any, e2e_s: float) -> Entry:
        """A request answered with an error before any work (a 400's field, a 429)."""
        self.status, self.error, self.param, self.e2e_s = exc.status, exc.message, exc.param, e2e_s
        return self

    def accepted(self, rid: str, req: Any) -> None:
        self.id, self.model, self.stream = rid, req.model, req.stream
        self.prompt_tokens, self.max_tokens = len(req.token_ids), req.max_tokens

    def finished(self, status: int, out: Any, reply: Any, ttft_s: float | None,
                 first_text_s: float | None, e2e_s: float, exc: Any = None) -> None:
        self.status, self.ttft_s, self.first_text_s, self.e2e_s = (status, ttft_s,
                                                                  first_text_s, e2e_s)
        self.completion_tokens = sum(c.num_tokens for c in reply.choices)
        self.route = out.route or None
        self.cached_tokens, self.retried, self.resumed = (out.cached_tokens, out.retried,
                                                          out.resumed)
        if exc is not None:
            self.error, self.param = exc.message, exc.param

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    """Appends entries to `path` (JSON Lines), one write and flush per request."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, entry: Entry) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(entry.to_json(), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every entry of a request log (a partial last line, from a router killed mid-write,
    is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
