"""The hybrid prefix cache pool: one byte budget shared by every kind of cached state.

Entries are full-attention KV blocks (keyed by chained block hash), state snapshots (keyed by
the hash of the block they follow; linear recurrent state + SWA windows, valid only at exactly
that length) and transfer buffers (a prefill's tail awaiting the wire, any length, freed once
sent). The hybrid hit rule: a prefix of i blocks is usable iff blocks 0..i-1 are all present
(when the model has full-attention layers) and a snapshot exists after block i-1 (when it has
linear/SWA layers). Pinned entries (refcount > 0) are never evicted; unpinned prefix-cache
entries are evicted least-recently-used first, chain tails before heads. Transfer buffers are
never evicted; when even eviction cannot make room `allocate_transfer` returns False.
Contract the global manager's fast search relies on (tests check it under churn): resident
blocks are prefix-closed (block i resident => blocks 0..i-1 resident) and a snapshot is resident
only with its block; it holds because chains are added head first, re-queued tail-oldest, and
pinned as whole prefixes. No clocks: `now` is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prfaas.cache.config import PoolConfig, snapshot_boundaries
from prfaas.cache.layout import CacheLayout
from prfaas.cache.listener import PoolListener
from prfaas.core.errors import ConfigError, PrfaasError
from prfaas.models.kv import KVGeometry

_HASH_LIMIT = 1 << 64
_SNAP = 1 << 64  # snapshot key = block hash + _SNAP: one dict and one LRU for both kinds


class PinError(PrfaasError):
    """release() of entries that are not pinned: the caller's acquire/release are unbalanced."""


@dataclass(slots=True)
class PoolStats:
    queries: int = 0
    hits: int = 0  # queries that matched at least one block
    misses: int = 0
    hit_blocks: int = 0
    inserted_blocks: int = 0
    inserted_snapshots: int = 0
    evictions: int = 0  # entries evicted (blocks and snapshots)
    evicted_bytes: int = 0
    transfer_rejects: int = 0  # allocate_transfer answered False (back-pressure)
    last_insert_s: float = 0.0


class HybridPrefixPool:
    def __init__(self, instance_id: str, geometry: KVGeometry, config: PoolConfig,
                 listener: PoolListener | None = None) -> None:
        self.instance_id = instance_id  # the pool's id; one pool may serve many instances
        self.config = config
        self.layout = CacheLayout(geometry, config.block_size_tokens)
        if config.max_request_tokens is not None:
            self.layout.check_fits(config.max_request_tokens, config)
        self.listener = listener
        self.stats = PoolStats()
        self._resident: dict[int, int] = {}  # key -> bytes
        self._refs: dict[int, int] = {}  # pinned keys only
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned resident keys, oldest first
        self._transfers: dict[str, int] = {}  # request id -> bytes
        self._used_bytes = 0
        self._evictable_bytes = 0  # bytes of the entries in _lru

    # --- sizes --------------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int | None:
        return self.config.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def transfer_bytes(self) -> int:
        return sum(self._transfers.values())

    @property
    def num_blocks(self) -> int:
        return sum(1 for k in self._resident if k < _SNAP)

    @property
    def num_snapshots(self) -> int:
        return len(self._resident) - self.num_blocks

    def _free_bytes(self) -> float:
        cap = self.config.capacity_bytes
        return float("inf") if cap is None else cap - self._used_bytes

    def attach(self, listener: PoolListener) -> None:
        """Make `listener` this pool's listener and announce everything already resident (a
        manager that starts, or restarts, after the pool is filled)."""
        self.listener = listener
        blocks = [k for k in self._resident if k < _SNAP]
        snaps = [k - _SNAP for k in self._resident if k >= _SNAP]
        if blocks or snaps:
            listener.on_insert(self.instance_id, blocks, snaps)

    # --- queries ------------------------------------------------------------------------------
    def match(self, block_hashes: Sequence[int]) -> int:
        """Number of leading blocks of `block_hashes` usable as a cache hit (hybrid rule)."""
        best = self._longest(block_hashes)
        self.stats.queries += 1
        self.stats.hit_blocks += best
        if best:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        return best

    def _longest(self, block_hashes: Sequence[int]) -> int:
        resident = self._resident
        need_blocks, need_snaps = self.layout.needs_blocks, self.layout.needs_snapshots
        best = 0
        for i, h in enumerate(block_hashes):
            if need_blocks and h not in resident:
                break
            if not need_snaps or h + _SNAP in resident:
                best = i + 1
        return best

    def contains_block(self, block_hash: int) -> bool:
        return block_hash in self._resident

    def has_snapshot(self, block_hash: int) -> bool:
        return block_hash + _SNAP in self._resident

    # --- commit -------------------------------------------------------------------------------
    def insert(self, block_hashes: Sequence[int], num_tokens: int, now: float = 0.0) -> int:
        """Commit a finished prefill's full blocks and its snapshots (per the policy), evicting
        LRU entries as needed. Returns how many leading blocks are now a usable hit. Raises
        ConfigError when the request can never fit in the pool's capacity."""
        layout, config = self.layout, self.config
        layout.check_fits(num_tokens, config, layout.request_bytes(num_tokens, config),
                          "one request's prefix-cache needs")
        num_blocks = min(len(block_hashes), num_tokens // config.block_size_tokens)
        chain = list(block_hashes[:num_blocks])
        _check_hashes(chain)
        keys = self._chain_keys(chain)
        for key in keys:  # protect the chain's own entries from the eviction below
            self._lru_remove(key)
        need = sum(size for key, size in keys.items() if key not in self._resident)
        self._make_room(need)
        added_blocks, added_snaps = self._add_while_room(keys)
        for key in reversed(keys):  # heads most recent: the LRU drops chain tails first
            if key in self._resident and key not in self._refs:
                self._lru_add(key)
        self.stats.last_insert_s = now
        self.stats.inserted_blocks += len(added_blocks)
        self.stats.inserted_snapshots += len(added_snaps)
        if self.listener is not None and (added_blocks or added_snaps):
            self.listener.on_insert(self.instance_id, added_blocks, added_snaps)
        return self._longest(chain)

    def _chain_keys(self, chain: list[int]) -> dict[int, int]:
        """Entries a committed chain wants, in chain order: block i, then its snapshot."""
        layout, config = self.layout, self.config
        marks = set(snapshot_boundaries(len(chain), config.snapshot_policy,
                                        config.snapshot_every_k))
        keys: dict[int, int] = {}
        for i, h in enumerate(chain):
            if layout.needs_blocks:
                keys[h] = layout.block_bytes
            if layout.needs_snapshots and i + 1 in marks:
                keys[h + _SNAP] = layout.snapshot_bytes(i + 1)
        return keys

    def _add_while_room(self, keys: dict[int, int]) -> tuple[list[int], list[int]]:
        """Add missing entries in chain order; stop at the first that does not fit (a later
        entry is useless without the earlier blocks)."""
        blocks: list[int] = []
        snaps: list[int] = []
        for key, size in keys.items():
            if key in self._resident:
                continue
            if size > self._free_bytes():
                break
            self._resident[key] = size
            self._used_bytes += size
            if key >= _SNAP:
                snaps.append(key - _SNAP)
            else:
                blocks.append(key)
        return blocks, snaps

    def _lru_add(self, key: int) -> None:
        self._lru[key] = None
        self._evictable_bytes += self._resident[key]

    def _lru_remove(self, key: int) -> None:
        if key in self._lru:
            del self._lru[key]
            self._evictable_bytes -= self._resident[key]

    def _make_room(self, need_bytes: float) -> None:
        """Evict unpinned entries, least recently used first, until `need_bytes` are free."""
        evicted_blocks: list[int] = []
        evicted_snaps: list[int] = []
        while self._lru and self._free_bytes() < need_bytes:
            key, _ = self._lru.popitem(last=False)
            size = self._resident.pop(key)
            self._used_bytes -= size
            self._evictable_bytes -= size
            self.stats.evictions += 1
            self.stats.evicted_bytes += size
            if key >= _SNAP:
                evicted_snaps.append(key - _SNAP)
            else:
                evicted_blocks.append(key)
        if self.listener is not None and (evicted_blocks or evicted_snaps):
            self.listener.on_evict(self.instance_id, evicted_blocks, evicted_snaps)

    # --- pinning ------------------------------------------------------------------------------
    def _hit_keys(self, block_hashes: Sequence[int], num_blocks: int) -> list[int]:
        if not 0 <= num_blocks <= len(block_hashes):
            raise ConfigError("num_blocks", num_blocks,
                              f"must be within 0..{len(block_hashes)} (the chain's length)")
        keys = list(block_hashes[:num_blocks]) if self.layout.needs_blocks else []
        if self.layout.needs_snapshots and num_blocks:
            keys.append(block_hashes[num_blocks - 1] + _SNAP)
        return keys

    def acquire(self, block_hashes: Sequence[int], num_blocks: int) -> bool:
        """Pin the entries of a `num_blocks` hit so they cannot be evicted while in use.
        Returns False (pinning nothing) when the hit is no longer fully resident."""
        keys = self._hit_keys(block_hashes, num_blocks)
        if any(key not in self._resident for key in keys):
            return False
        for key in keys:
            self._refs[key] = self._refs.get(key, 0) + 1
            self._lru_remove(key)
        return True

    def release(self, block_hashes: Sequence[int], num_blocks: int) -> None:
        """Undo one acquire() of the same hit; freed entries become most recently used."""
        keys = self._hit_keys(block_hashes, num_blocks)
        unpinned = [key for key in keys if key not in self._refs]
        if unpinned:
            raise PinError(f"release of {len(unpinned)} entries that are not pinned "
                           f"(first key {unpinned[0]:#x}) in pool {self.instance_id}")
        for key in reversed(keys):
            count = self._refs[key] - 1
            if count:
                self._refs[key] = count
            else:
                del self._refs[key]
                self._lru_add(key)

    # --- transfer buffers ---------------------------------------------------------------------
    def allocate_transfer(self, request_id: str, num_tokens: int) -> bool:
        """Reserve a transfer buffer for `num_tokens` tokens of KV + state. False when the pool
        cannot make room now (back-pressure); ConfigError when it never could."""
        if request_id in self._transfers:
            raise ConfigError("request_id", request_id, "already holds a transfer buffer")
        need = self.layout.transfer_bytes(num_tokens)
        self.layout.check_fits(num_tokens, self.config, need, "one request's transfer buffer")
        if need > self._free_bytes() + self._evictable_bytes:  # do not evict in vain
            self.stats.transfer_rejects += 1
            return False
        self._make_room(need)
        if need > self._free_bytes():
            self.stats.transfer_rejects += 1
            return False
        self._transfers[request_id] = need
        self._used_bytes += need
        return True

    def free_transfer(self, request_id: str) -> int:
        """Free a request's transfer buffer (after it was sent); returns the bytes freed."""
        size = self._transfers.pop(request_id, None)
        if size is None:
            raise ConfigError("request_id", request_id, "holds no transfer buffer")
        self._used_bytes -= size
        return size


def _check_hashes(chain: list[int]) -> None:
    if chain and (min(chain) < 0 or max(chain) >= _HASH_LIMIT):
        bad = next(h for h in chain if not 0 <= h < _HASH_LIMIT)
        raise ConfigError("block_hashes", bad, "block hashes must be unsigned 64-bit ints")
