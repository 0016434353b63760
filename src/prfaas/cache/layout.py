"""What one cached block and one state snapshot cost, and which of them a hit needs.

Derived from a model's KV geometry and the block size:
- a full-attention block holds `block_size_tokens` tokens of every gqa/mla layer;
- a state snapshot holds every linear layer's recurrent state plus every SWA layer's window at
  one block boundary (fixed size once the boundary is past the window);
- a transfer buffer holds a prefill's tail for the wire: S_kv(l) for any l, not block aligned.
Byte sizes are rounded up to whole bytes. A dense model needs no snapshots; a model of only
linear/SWA layers needs only snapshots; a hybrid model needs both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.cache.config import PoolConfig, snapshot_boundaries
from prfaas.core.errors import ConfigError
from prfaas.models.kv import KVGeometry


@dataclass(frozen=True, slots=True)
class CacheLayout:
    geometry: KVGeometry
    block_size_tokens: int

    def __post_init__(self) -> None:
        if self.block_size_tokens <= 0:
            raise ConfigError("block_size_tokens", self.block_size_tokens, "must be positive")
        if not (self.needs_blocks or self.needs_snapshots):
            raise ConfigError("geometry", self.geometry.model, "model caches no KV and no state")

    @property
    def needs_blocks(self) -> bool:
        return self.geometry.kv_bytes_per_token > 0

    @property
    def needs_snapshots(self) -> bool:
        g = self.geometry
        return g.linear_state_bytes > 0 or g.swa_bytes_per_token > 0

    @property
    def block_bytes(self) -> int:
        return math.ceil(self.geometry.kv_bytes_per_token * self.block_size_tokens)

    def snapshot_bytes(self, num_blocks: int) -> int:
        """Bytes of the state snapshot taken after `num_blocks` full blocks."""
        if not self.needs_snapshots:
            return 0
        length_tokens = num_blocks * self.block_size_tokens
        return math.ceil(self.geometry.linear_state_bytes + self.geometry.swa_bytes(length_tokens))

    def transfer_bytes(self, num_tokens: int) -> int:
        """Bytes of a transfer buffer for `num_tokens` tokens of KV plus the final state."""
        return math.ceil(self.geometry.size_bytes(num_tokens))

    def request_bytes(self, num_tokens: int, config: PoolConfig) -> int:
        """Prefix-cache bytes that committing one request of `num_tokens` tokens takes."""
        num_blocks = num_tokens // self.block_size_tokens
        marks = snapshot_boundaries(num_blocks, config.snapshot_policy, config.snapshot_every_k)
        snaps = sum(self.snapshot_bytes(b) for b in marks) if self.needs_snapshots else 0
        blocks = num_blocks * self.block_bytes if self.needs_blocks else 0
        return blocks + snaps

    def check_fits(self, num_tokens: int, config: PoolConfig, need_bytes: int | None = None,
                   what: str = "one request's needs") -> None:
        """Raise ConfigError when `need_bytes` (default: the larger of committing and
        transferring one request of `num_tokens` tokens) can never fit in the pool."""
        if num_tokens < 0:
            raise ConfigError("num_tokens", num_tokens, "must be >= 0")
        cap = config.capacity_bytes
        if cap is None:
            return
        if need_bytes is None:
            need_bytes = max(self.request_bytes(num_tokens, config),
                             self.transfer_bytes(num_tokens))
        if need_bytes > cap:
            raise ConfigError("capacity_bytes", cap,
                              f"smaller than {what}: {need_bytes} bytes for {num_tokens} tokens "
                              f"of {self.geometry.model} (snapshot policy "
                              f"{config.snapshot_policy})")
