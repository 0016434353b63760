"""Byte-level tokenizer: token id = byte value (0..255), plus BOS (256) and EOS (257).

Nothing is downloaded. The special tokens' own text in a prompt ("<|bos|>", "<|eos|>") is that
special token, as Hugging Face tokenizers and so vLLM's server read it (benchmark clients put
BOS into the prompts they generate: aiperf separates prompt blocks with it); any other string
is its UTF-8 bytes and round-trips. The same tokenizer as a Hugging Face folder, for clients:
models/hf_tokenizer.py. `decode` skips the special ids and replaces invalid UTF-8 (a
random-weight model emits arbitrary bytes).
"""

from __future__ import annotations

import re

from prfaas.core.errors import ConfigError

BOS_TEXT, EOS_TEXT = "<|bos|>", "<|eos|>"
_SPECIAL_RE = re.compile(f"({re.escape(BOS_TEXT)}|{re.escape(EOS_TEXT)})")


class ByteTokenizer:
    bos_id = 256
    eos_id = 257
    vocab_size = 258

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        if "<|" not in text:
            ids = list(text.encode("utf-8"))
        else:
            special = {BOS_TEXT: self.bos_id, EOS_TEXT: self.eos_id}
            ids = []
            for part in _SPECIAL_RE.split(text):
                if part in special:
                    ids.append(special[part])
                else:
                    ids.extend(part.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ConfigError("token_id", i, f"outside [0, {self.vocab_size})")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
