"""Chained block hashes: the identity of a cached prefix.

Hash i covers tokens [0, (i+1)*block_size): h_i = blake2b-64(h_{i-1} || tokens of block i),
with h_{-1} = the seed. Only full blocks are hashed (a partial tail is never a prefix-cache
block). The result is the same in every process and on every host (no Python `hash()`), so the
router, the workers and the simulator agree on block identity. Mooncake traces already carry
chained ids for 512-token blocks (`hash_ids`); `trace_block_hashes` uses them as-is.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from hashlib import blake2b

from prfaas.core.errors import ConfigError

_U64 = struct.Struct("<Q")
_HASH_BYTES = 8


def chain_hashes(token_ids: Sequence[int], block_size_tokens: int, seed: int = 0) -> list[int]:
    """Chained 64-bit hashes of the full blocks of `token_ids` (len = len(tokens) // bs)."""
    if block_size_tokens <= 0:
        raise ConfigError("block_size_tokens", block_size_tokens, "must be positive")
    if not 0 <= seed < 1 << 64:
        raise ConfigError("seed", seed, "must fit in 64 unsigned bits")
    block = struct.Struct(f"<{block_size_tokens}q")
    prev = _U64.pack(seed)
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size_tokens + 1, block_size_tokens):
        try:
            payload = block.pack(*token_ids[start:start + block_size_tokens])
        except struct.error as exc:
            raise ConfigError("token_ids", f"block {len(out)}", f"not 64-bit ints: {exc}") from exc
        prev = blake2b(prev + payload, digest_size=_HASH_BYTES).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def trace_block_hashes(hash_ids: Sequence[int], input_length_tokens: int,
                       block_size_tokens: int = 512) -> list[int]:
    """The full-block prefix of a Mooncake trace row's `hash_ids` (its last id may cover a
    partial block, which is not cacheable)."""
    if input_length_tokens < 0:
        raise ConfigError("input_length", input_length_tokens, "must be >= 0")
    num_full = input_length_tokens // block_size_tokens
    if len(hash_ids) < num_full:
        raise ConfigError("hash_ids", len(hash_ids),
                          f"fewer ids than the {num_full} full blocks of {input_length_tokens} "
                          f"tokens at {block_size_tokens} tokens/block")
    return list(hash_ids[:num_full])
