"""One choice of a response as its tokens arrive: text (stop strings cut, stops.py) and the
logprob entries of the tokens whose text was released, in OpenAI's two shapes.

Tokens are bytes (id < 256) or specials; a token's display string is the character when the
byte is ASCII, else `bytes:\\xNN` (OpenAI's and vLLM's convention for a partial character);
chat entries also carry `bytes`. A token's logprob entry is released once its text is: when a
stop string ends the choice, tokens that start at or after the stop string are dropped (their
text is not returned), as are their logprobs. `text_offset` is the entry's first character in
the returned text (after the echoed prompt, with `echo`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from prfaas.serve.stops import StopText

SPECIAL = {256: "<|bos|>", 257: "<|eos|>"}


def token_text(token: int) -> str:
    if token in SPECIAL:
        return SPECIAL[token]
    return chr(token) if token < 128 else f"bytes:\\x{token:02x}"


def token_bytes(token: int) -> list[int]:
    return [token] if token < 256 else []


@dataclass(frozen=True, slots=True)
class Entry:
    token: int
    logprob: float | None  # None: the prompt's first token (nothing to condition on)
    top: tuple[tuple[int, float], ...]
    char_start: int
    char_end: int


@dataclass(slots=True)
class Choice:
    index: int
    text: StopText
    entries: list[Entry] = field(default_factory=list)
    cum_logprob: float = 0.0
    num_tokens: int = 0
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    _released_entries: int = 0

    @classmethod
    def new(cls, index: int, stops: tuple[str, ...], min_tokens: int) -> Choice:
        return cls(index, StopText(stops, min_tokens))

    @property
    def stopped(self) -> bool:
        return self.text.stopped

    def feed(self, token: int, logprob: float, top: tuple[tuple[int, float], ...] = (),
             text: str | None = None) -> tuple[str, list[Entry]]:
        """Add a generated token; the text and entries it releases (`text`: StopText.feed)."""
        self.num_tokens += 1
        self.cum_logprob += logprob
        if self.text.stopped:
            return "", []
        start = self.text.decoded_chars
        piece = self.text.feed(token, text)
        self.entries.append(Entry(token, logprob, top, start, self.text.decoded_chars))
        self.parts.append(piece)
        limit = self.text.released_chars
        if self.text.stopped:
            self.entries = [e for e in self.entries if e.char_start < limit]
            return piece, self._release(len(self.entries))
        ready = self._released_entries
        while ready < len(self.entries) and self.entries[ready].char_end <= limit:
            ready += 1
        return piece, self._release(ready)

    def finish(self, max_tokens: int) -> tuple[str, list[Entry]]:
        """End of the sequence: the held text and remaining entries; sets the reason
        ("stop" for a stop string, EOS or stop token; "length" at max_tokens)."""
        piece = self.text.flush()
        self.parts.append(piece)
        self.finish_reason = ("length" if not self.text.stopped and self.num_tokens >= max_tokens
                              else "stop")
        return piece, self._release(len(self.entries))

    def _release(self, upto: int) -> list[Entry]:
        out = self.entries[self._released_entries:upto]
        self._released_entries = max(upto, self._released_entries)
        return out

    @property
    def full_text(self) -> str:
        return "".join(self.parts)


def prompt_entries(token_ids: list[int], prompt_logprobs: list[Any]) -> list[Entry]:
    """Echo: entries of the prompt's tokens; `prompt_logprobs[i]` = [logprob, [[id, lp]...]]
    of token i + 1 (the prefill worker's reply)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars, out = 0, []
    for i, token in enumerate(token_ids):
        start = chars
        chars += len(decoder.decode(bytes([token]))) if token < 256 else 0
        if i == 0:
            out.append(Entry(token, None, (), start, chars))
            continue
        lp, top = prompt_logprobs[i - 1]
        out.append(Entry(token, float(lp), tuple((int(t), float(v)) for t, v in top), start,
                         chars))
    return out


def completion_logprobs(entries: list[Entry], offset: int = 0) -> dict[str, Any]:
    """The legacy completions shape: parallel lists; `top_logprobs` maps token strings to
    logprobs (the top-k plus the token itself)."""
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.logprob is None:
            tops.append(None)
            continue
        top = {token_text(t): v for t, v in e.top}
        top.setdefault(token_text(e.token), e.logprob)
        tops.append(top)
    return {"tokens": [token_text(e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": [e.char_start + offset for e in entries]}


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: [v for p in parts for v in p[k]] for k in
            ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_logprobs(entries: list[Entry]) -> dict[str, Any]:
    return {"content": [
        {"token": token_text(e.token), "logprob": e.logprob, "bytes": token_bytes(e.token),
         "top_logprobs": [{"token": token_text(t), "logprob": v, "bytes": token_bytes(t)}
                          for t, v in e.top]} for e in entries]}
