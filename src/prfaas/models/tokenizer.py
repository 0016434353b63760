"""Byte-level tokenizer: token id = byte value (0..255), plus BOS (256) and EOS (257).

Nothing is downloaded; every UTF-8 string round-trips. `decode` skips the special ids and
replaces invalid UTF-8 (a random-weight model emits arbitrary bytes).
"""

from __future__ import annotations

from prfaas.core.errors import ConfigError


class ByteTokenizer:
    bos_id = 256
    eos_id = 257
    vocab_size = 258

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ConfigError("token_id", i, f"outside [0, {self.vocab_size})")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
