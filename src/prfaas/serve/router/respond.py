"""One request's OpenAI reply, built from the token events of its sequences.

`Reply.token(seq, token, logprob, top)` feeds sequence `seq` (of `best_of`, n unless asked) and
returns the SSE chunk bodies that token releases (text cut at stop strings, choices.py);
`Reply.finish()` ends every sequence and returns the closing chunks; `Reply.whole()` is the
non-streaming body: with best_of > n, the n sequences of highest cumulative logprob (as vLLM),
and with `echo` the prompt's text (and its logprobs, from the prefill) before the completion.
`usage` counts every generated token of every sequence, and the prompt tokens the prefill
node took from its cache as `prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import time
from typing import Any

from prfaas.serve.router.choices import (
    Choice,
    Entry,
    chat_logprobs,
    completion_logprobs,
    merge_completion_logprobs,
    prompt_entries,
)
from prfaas.serve.router.openai_api import ApiError, GenRequest


class Reply:
    def __init__(self, req: GenRequest, rid: str) -> None:
        self.req, self.rid = req, rid
        self.created = int(time.time())
        self.choices = [Choice.new(i, req.stop, req.min_tokens) for i in range(req.best_of)]
        self._started: set[int] = set()

    # streaming --------------------------------------------------------------------------

    def token(self, seq: int, token: int, logprob: float,
              top: tuple[tuple[int, float], ...] = (), text: str | None = None
              ) -> list[dict[str, Any]]:
        if not 0 <= seq < len(self.choices):
            raise ValueError(f"token event for sequence {seq} of {len(self.choices)}")
        choice = self.choices[seq]
        text, entries = choice.feed(token, logprob, top, text)
        first = seq not in self._started
        if not (text or entries or first):
            return []
        self._started.add(seq)
        return [self._usage_on(self.chunk(self._delta(choice, text, entries, None, first)),
                               choice)]

    def finish(self) -> list[dict[str, Any]]:
        chunks = []
        for choice in self.choices:
            text, entries = choice.finish(self.req.max_tokens)
            first = choice.index not in self._started
            chunks.append(self._usage_on(self.chunk(self._delta(
                choice, text, entries, choice.finish_reason, first)), choice))
        return chunks

    def _usage_on(self, chunk: dict[str, Any], choice: Choice) -> dict[str, Any]:
        """`continuous_usage_stats`: the chunk carries the prompt's tokens and its choice's
        tokens so far (vLLM's per-chunk usage: no cached-token details)."""
        if self.req.continuous_usage:
            n_in = len(self.req.token_ids)
            chunk["usage"] = {"prompt_tokens": n_in, "completion_tokens": choice.num_tokens,
                              "total_tokens": n_in + choice.num_tokens}
        return chunk

    def chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created,
                "model": self.req.model, "choices": [choice] if choice else []}

    def _delta(self, choice: Choice, text: str, entries: list[Entry], finish: str | None,
               first: bool) -> dict[str, Any]:
        lp = self._logprobs(entries) if self.req.logprobs is not None else None
        if not self.req.chat:
            return {"index": choice.index, "text": text, "finish_reason": finish, "logprobs": lp}
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        return {"index": choice.index, "delta": delta, "finish_reason": finish, "logprobs": lp}

    def _logprobs(self, entries: list[Entry], offset: int = 0) -> dict[str, Any]:
        return chat_logprobs(entries) if self.req.chat else completion_logprobs(entries, offset)

    # whole ------------------------------------------------------------------------------

    def whole(self, usage: dict[str, Any], prompt_logprobs: list[Any] | None
              ) -> dict[str, Any]:
        """The non-streaming body (after `finish()`)."""
        req = self.req
        ranked = sorted(self.choices, key=lambda c: -c.cum_logprob) if req.best_of > req.n \
            else self.choices
        out = []
        for index, choice in enumerate(ranked[:req.n]):
            lp = None
            if req.logprobs is not None:
                lp = self._logprobs(choice.entries, len(req.prompt_text) if req.echo else 0)
                if req.echo:
                    head = prompt_entries(req.token_ids, prompt_logprobs or [])
                    lp = merge_completion_logprobs([completion_logprobs(head), lp])
            if req.chat:
                body: dict[str, Any] = {"index": index, "message": {
                    "role": "assistant", "content": choice.full_text}}
            else:
                text = (req.prompt_text if req.echo else "") + choice.full_text
                body = {"index": index, "text": text}
            out.append({**body, "finish_reason": choice.finish_reason, "logprobs": lp})
        kind = "chat.completion" if req.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": req.model,
                "choices": out, "usage": usage}

    def usage(self, cached_tokens: int) -> dict[str, Any]:
        n_in = len(self.req.token_ids)
        n_out = sum(c.num_tokens for c in self.choices)
        return {"prompt_tokens": n_in, "completion_tokens": n_out,
                "total_tokens": n_in + n_out,
                "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def feed(reply: Reply, event: Any) -> list[dict[str, Any]]:
    """A backend's token event (`token_id`, `extra`: `seq`, `lp`, `top`, and `text` when the
    engine detokenizes itself) into the reply. What
    the request needs and the event lacks (a backend that reports no logprobs, or no sequence
    index for n > 1) is a 502, never a made-up value."""
    extra, req = event.extra, reply.req
    needs = {"lp": req.logprobs is not None or req.best_of > req.n,
             "top": bool(req.logprobs), "seq": req.best_of > 1}
    missing = [k for k, needed in needs.items() if needed and k not in extra]
    if missing:
        raise ApiError(502, f"the worker backend's token events lack {missing}, which this "
                            "request needs", kind="server_error", code="bad_worker_reply")
    try:
        top = tuple((int(t), float(v)) for t, v in extra.get("top", ()))
        text = extra.get("text")
        return reply.token(int(extra.get("seq", 0)), event.token_id,
                           float(extra.get("lp", 0.0)), top,
                           text if isinstance(text, str) else None)
    except (TypeError, ValueError) as exc:
        raise ApiError(502, f"malformed token event from the decode worker: {exc}",
                       kind="server_error", code="bad_worker_reply") from exc


def prompt_logprobs(req: GenRequest, out: Any) -> list[Any] | None:
    """The prefill's prompt logprobs when `echo` + `logprobs` needs them (else None)."""
    if not (req.echo and req.logprobs is not None):
        return None
    got = out.prompt_logprobs  # a resumed attempt's prompt is longer: keep the request's part
    if not isinstance(got, list) or len(got) < len(req.token_ids) - 1:
        raise ApiError(502, "the prefill worker returned no prompt logprobs for echo",
                       kind="server_error", code="bad_worker_reply")
    return got[:len(req.token_ids) - 1]
