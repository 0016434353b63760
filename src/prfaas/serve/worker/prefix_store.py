"""A worker's own prefix cache: `SequenceKV` prefixes keyed by chained block hashes.

Each entry is a sequence cut at a block boundary; every block hash along it is indexed, so a
lookup finds the longest cached block-aligned prefix of a prompt and returns
`entry.snapshot_at(n)` (shared full blocks, no copy). The entry must hold a usable state at
every indexed boundary (the engine's prefill snapshots linear states at each block; a decode
worker indexes only the boundary it injected). Least-recently-used entries are dropped when
the byte budget (`held_bytes`) is exceeded. Inserts and evictions are returned as hash lists
so the worker can report them to the router's GlobalKVCacheManager.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from prfaas.cache import chain_hashes
from prfaas.engine import SequenceKV


@dataclass(slots=True)
class CacheDelta:
    """Block hashes that became / stopped being available in this pool (blocks = snapshots:
    every indexed boundary has both)."""

    inserted: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, list[int]]:
        return {"inserted": self.inserted, "evicted": self.evicted}


@dataclass(slots=True)
class _Entry:
    kv: SequenceKV
    hashes: list[int]  # hashes of the boundaries this entry serves, in order
    nbytes: int


class PrefixStore:
    def __init__(self, block_size_tokens: int, capacity_bytes: int) -> None:
        self.block_size_tokens = block_size_tokens
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # entry id -> entry, LRU first
        self._index: dict[int, dict[int, int]] = {}  # hash -> {entry id: boundary index}
        self._next_id = 0
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0

    def hashes(self, token_ids: list[int]) -> list[int]:
        return chain_hashes(token_ids, self.block_size_tokens)

    def lookup(self, token_ids: list[int], max_tokens: int) -> SequenceKV | None:
        """The longest cached prefix of at most `max_tokens` tokens (block aligned), or None."""
        hashes = self.hashes(token_ids)[: max_tokens // self.block_size_tokens]
        for i in range(len(hashes) - 1, -1, -1):
            holders = self._index.get(hashes[i])
            if holders:
                entry_id = next(iter(holders))
                self._entries.move_to_end(entry_id)
                self.hits += 1
                kv = self._entries[entry_id].kv
                return kv.snapshot_at((i + 1) * self.block_size_tokens)
        self.misses += 1
        return None

    def insert(self, kv: SequenceKV, token_ids: list[int], boundaries: list[int] | None = None
               ) -> CacheDelta:
        """Keep `kv` cut at the last full block it holds a state at; index every boundary
        it has a state at (a linear layer's snapshots may be sparser than the blocks:
        `snapshot_every_blocks`), or only the given block counts."""
        delta = CacheDelta()
        num_blocks = min(kv.num_tokens, len(token_ids)) // self.block_size_tokens
        if num_blocks == 0:
            return delta
        hashes = self.hashes(token_ids[: num_blocks * self.block_size_tokens])
        wanted = set(boundaries) if boundaries is not None else {
            b for b in range(1, num_blocks + 1) if has_state_at(kv, b * self.block_size_tokens)}
        keep = {i: h for i, h in enumerate(hashes) if (i + 1) in wanted}
        if not keep or all(h in self._index for h in keep.values()):
            return delta  # nothing new: do not spend bytes on a duplicate
        last = max(keep) + 1 if boundaries is None else num_blocks
        cut = kv.snapshot_at(last * self.block_size_tokens)
        entry = _Entry(cut, list(keep.values()), cut.held_bytes())
        if entry.nbytes > self.capacity_bytes:
            return delta
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = entry
        self.used_bytes += entry.nbytes
        for i, h in keep.items():
            holders = self._index.setdefault(h, {})
            if not holders:
                delta.inserted.append(h)
            holders[entry_id] = i
        self._evict_to_fit(delta, protect=entry_id)
        return delta

    def _evict_to_fit(self, delta: CacheDelta, protect: int) -> None:
        while self.used_bytes > self.capacity_bytes:
            victim = next((e for e in self._entries if e != protect), None)
            if victim is None:
                return
            entry = self._entries.pop(victim)
            self.used_bytes -= entry.nbytes
            for h in entry.hashes:
                holders = self._index.get(h, {})
                holders.pop(victim, None)
                if not holders:
                    self._index.pop(h, None)
                    delta.evicted.append(h)

    @property
    def num_entries(self) -> int:
        return len(self._entries)


def has_state_at(kv: SequenceKV, num_tokens: int) -> bool:
    """Whether every layer of `kv` can continue from `num_tokens` (a linear layer needs its
    state there: a snapshot, or its current state)."""
    for store in kv.stores:
        snapshots = getattr(store, "snapshots", None)
        if snapshots is not None and num_tokens not in snapshots and store.num_tokens != num_tokens:
            return False
    return True
