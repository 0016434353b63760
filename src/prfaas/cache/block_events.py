"""An engine's own KV-cache events, translated into the manager's chain hashes.

An engine that publishes what its prefix cache stores and drops (vLLM's KV events:
BlockStored / BlockRemoved / AllBlocksCleared) names blocks by ITS hashes (vLLM: seeded,
per-process, with extra keys), not ours. A BlockStored event carries the token ids of the
blocks it stores and the engine hash of their parent block, so `EngineBlockIndex` computes our
chained hash of each block (hashing.chain_hashes, continued from the parent's hash of ours) and
keeps engine hash -> our hash for the blocks the instance holds; a BlockRemoved is translated
through that map. The manager then sees the instance's cache as the instance itself reports it,
evictions included.

Hybrid engines keep one cache group per layer kind: full/sliding attention groups hold KV blocks
(the manager's "blocks"), mamba/GDN groups hold state pages (its "snapshots"). A hash counts as
held in a kind when every group of that kind seen so far holds it; an engine with no state
group (dense model) reports each block as its own snapshot, as the request-path reports do.

What cannot be placed is counted, never guessed: a block whose parent this index does not know
(it missed the parent's event), a block size other than the instance's, and an event whose
hashes do not line up with its token ids (vLLM skips masked blocks of mamba groups in
align mode). Policy core: no sockets, no clock; the subscriber that feeds it lives with the
engine's integration.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from prfaas.cache.hashing import chain_hashes
from prfaas.cache.listener import PoolListener
from prfaas.core.errors import ConfigError

STATE_KINDS = frozenset({"mamba"})  # groups whose pages are recurrent state, not KV blocks


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hashable, ...]  # the engine's hashes, one per stored full block
    parent_hash: Hashable | None  # the engine hash of the block before the first; None: none
    token_ids: tuple[int, ...]  # the stored blocks' tokens, in order
    block_size_tokens: int
    group: int = 0
    kind: str = "full_attention"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hashable, ...]
    group: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


BlockEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventStats:
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    resets: int = 0  # the index was dropped (events lost, instance restarted)
    unplaced_blocks: int = 0  # stored blocks that could not be mapped (see module doc)
    unknown_removed: int = 0  # removals of hashes the index did not hold


@dataclass(slots=True)
class _Held:
    groups: dict[str, set[int]] = field(default_factory=dict)  # kind class -> groups holding


class EngineBlockIndex:
    """One instance's engine events -> `listener` (the GlobalKVCacheManager) under `pool_id`."""

    def __init__(self, pool_id: str, listener: PoolListener, block_size_tokens: int,
                 seed: int = 0) -> None:
        if block_size_tokens <= 0:
            raise ConfigError("block_size_tokens", block_size_tokens, "must be positive")
        self.pool_id, self.listener = pool_id, listener
        self.block_size_tokens, self.seed = block_size_tokens, seed
        self.stats = EventStats()
        self._ours: dict[tuple[int, Hashable], int] = {}  # (group, engine hash) -> our hash
        self._any: dict[Hashable, int] = {}  # engine hash -> our hash (parents, any group)
        self._held: dict[int, _Held] = {}  # our hash -> groups holding it, by kind class
        self._kind_groups: dict[str, set[int]] = {"kv": set(), "state": set()}
        self._group_kind: dict[int, str] = {}

    @property
    def num_blocks(self) -> int:
        return sum(1 for h in self._held if self._present(h, "kv"))

    def apply(self, event: BlockEvent) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            self._removed(event)
        else:
            self.stats.cleared += 1
            self._drop_all()

    def reset(self) -> None:
        """Forget everything (events were lost or the instance restarted): the manager then
        counts nothing for this instance until new events arrive; never a block it lost."""
        self.stats.resets += 1
        self._drop_all()

    # --- events -------------------------------------------------------------------------------
    def _stored(self, ev: BlockStored) -> None:
        n = len(ev.block_hashes)
        if ev.block_size_tokens != self.block_size_tokens or len(ev.token_ids) != \
                n * ev.block_size_tokens:
            self.stats.unplaced_blocks += n
            return
        if ev.parent_hash is None:
            seed = self.seed
        elif ev.parent_hash in self._any:
            seed = self._any[ev.parent_hash]
        else:
            self.stats.unplaced_blocks += n
            return
        klass = "state" if ev.kind in STATE_KINDS else "kv"
        if ev.group not in self._kind_groups[klass]:
            self._learn_group(ev.group, klass)
        ours = chain_hashes(ev.token_ids, self.block_size_tokens, seed)
        added: list[int] = []
        for engine_hash, h in zip(ev.block_hashes, ours, strict=True):
            self._ours[(ev.group, engine_hash)] = h
            self._any[engine_hash] = h
            held = self._held.setdefault(h, _Held())
            before = self._present(h, "kv"), self._present(h, "state")
            held.groups.setdefault(klass, set()).add(ev.group)
            if (self._present(h, "kv"), self._present(h, "state")) != before:
                added.append(h)
        self.stats.stored_blocks += n
        if added:
            blocks = [h for h in added if self._present(h, "kv")]
            self.listener.on_insert(self.pool_id, blocks, self._snapshots(added))

    def _removed(self, ev: BlockRemoved) -> None:
        lost: list[tuple[int, bool, bool]] = []
        for engine_hash in ev.block_hashes:
            h = self._ours.pop((ev.group, engine_hash), None)
            if h is None:
                self.stats.unknown_removed += 1
                continue
            self.stats.removed_blocks += 1
            held = self._held.get(h)
            if held is None:
                continue
            before = self._present(h, "kv"), self._present(h, "state")
            held.groups.get(self._group_kind.get(ev.group, "kv"), set()).discard(ev.group)
            if not any(held.groups.values()):  # no group holds it: not a parent any more
                del self._held[h]
                self._any.pop(engine_hash, None)
            lost.append((h, *before))
        blocks = [h for h, kv, _ in lost if kv and not self._present(h, "kv")]
        snaps = [h for h, kv, st in lost if self._had_snapshot(kv, st)
                 and not self._has_snapshot(h)]
        if blocks or snaps:
            self.listener.on_evict(self.pool_id, blocks, snaps)

    def _learn_group(self, group: int, klass: str) -> None:
        """A group seen for the first time: what every group of its kind held may not be
        held any more (e.g. a dense-looking instance's first state group: its blocks were
        reported as their own snapshots); withdraw those entries."""
        before = {h: (self._present(h, "kv"), self._has_snapshot(h)) for h in self._held}
        self._group_kind[group] = klass
        self._kind_groups[klass].add(group)
        blocks = [h for h, (kv, _) in before.items() if kv and not self._present(h, "kv")]
        snaps = [h for h, (_, snap) in before.items() if snap and not self._has_snapshot(h)]
        if blocks or snaps:
            self.listener.on_evict(self.pool_id, blocks, snaps)

    def _drop_all(self) -> None:
        blocks = [h for h in self._held if self._present(h, "kv")]
        snaps = [h for h in self._held if self._has_snapshot(h)]
        self._ours.clear()
        self._any.clear()
        self._held.clear()
        if blocks or snaps:
            self.listener.on_evict(self.pool_id, blocks, snaps)

    # --- presence -----------------------------------------------------------------------------
    def _present(self, h: int, klass: str) -> bool:
        """Every group of this kind seen so far holds `h` (and there is one)."""
        want = self._kind_groups[klass]
        held = self._held.get(h)
        return bool(want) and held is not None and held.groups.get(klass, set()) >= want

    def _has_snapshot(self, h: int) -> bool:
        if self._kind_groups["state"]:
            return self._present(h, "state")
        return self._present(h, "kv")  # dense: a block is its own snapshot

    def _had_snapshot(self, kv: bool, state: bool) -> bool:
        return state if self._kind_groups["state"] else kv

    def _snapshots(self, hashes: Sequence[int]) -> list[int]:
        return [h for h in hashes if self._has_snapshot(h)]
