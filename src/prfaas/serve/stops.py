"""Stop strings on a byte-token stream, matched on the text a client sees.

`StopText` decodes token ids (byte-level: id = byte, specials produce no text) with an
incremental UTF-8 decoder, so a multi-byte character that spans tokens is matched whole, and
looks for the stop strings in the decoded text across token boundaries. `feed` returns the text
that can be released now: everything except the longest tail that could still begin a stop
string (and the bytes of an unfinished character, which the decoder holds). On a match the
text before the stop string is released, the stop string and anything after it are not, and
`stopped` is set. As vLLM, stop strings are not looked for before `min_tokens` tokens.
The decode worker runs the same matcher to end a sequence early; the router runs it to cut the
text, so both stop at the same token.
"""

from __future__ import annotations

import codecs


class StopText:
    def __init__(self, stops: tuple[str, ...] = (), min_tokens: int = 0) -> None:
        self.stops = tuple(s for s in stops if s)
        self.min_tokens = min_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet released
        self.released_chars = 0
        self.num_tokens = 0
        self.stopped = False
        self.matched = ""  # the stop string that ended the text

    @property
    def decoded_chars(self) -> int:
        """Characters decoded so far (released or held)."""
        return self.released_chars + len(self._pending)

    def feed(self, token: int, text: str | None = None) -> str:
        """The text token `token` releases ("" once stopped); `text`: the engine's own
        detokenization of the token (another engine's tokenizer), instead of byte decoding."""
        if self.stopped:
            return ""
        self.num_tokens += 1
        if text is not None:
            self._pending += text
        else:
            self._pending += self._decoder.decode(bytes([token])) if token < 256 else ""
        if not self.stops or self.num_tokens < self.min_tokens:
            return self._release(len(self._pending))
        hit = min(((i, s) for s in self.stops if (i := self._pending.find(s)) >= 0),
                  default=None)
        if hit is not None:
            self.stopped, self.matched = True, hit[1]
            return self._release(hit[0])
        return self._release(len(self._pending) - self._held())

    def flush(self) -> str:
        """At the end of the stream: whatever is held (an unfinished character becomes U+FFFD)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))

    def _held(self) -> int:
        """Length of the longest tail of the pending text that is a proper prefix of a stop."""
        text = self._pending
        for n in range(min(len(text), max(len(s) for s in self.stops) - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _release(self, upto: int) -> str:
        out, self._pending = self._pending[:upto], self._pending[upto:]
        self.released_chars += len(out)
        return out
