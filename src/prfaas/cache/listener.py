"""How a pool tells the world what it holds: the `PoolListener` protocol.

A pool calls `on_insert` after committing new entries and `on_evict` after dropping some, once
per operation, with the pool's id. A snapshot is named by the hash of the block whose end it
follows (so "snapshot at h_i" = state after tokens [0, (i+1)*bs)). Dense models report no
snapshots; models of only linear/SWA layers report no blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PoolListener(Protocol):
    def on_insert(self, pool_id: str, block_hashes: Sequence[int],
                  snapshot_hashes: Sequence[int]) -> None: ...

    def on_evict(self, pool_id: str, block_hashes: Sequence[int],
                 snapshot_hashes: Sequence[int]) -> None: ...
