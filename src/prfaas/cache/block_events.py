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
group (dense model) reports each block as its own snapshot, as the request-path reports do. A
hybrid prefix is then a hit only where vLLM can resume: attention blocks up to a boundary AND
a state kept at that boundary (the manager's hybrid rule).

vLLM's mamba groups in align mode (its default with prefix caching) keep a state only at some
block ends: a state group's BlockStored carries the tokens of the whole step but hashes only
for the kept blocks, so its hashes do not line up with its tokens. vLLM's block hashes are the
request's own, the same in every group (vllm/v1/core/block_pool.py, cache_full_blocks), so such
a state hash is placed through the hash -> our-hash names the attention groups' events give,
those of the same batch included (`apply_batch` reads the batch's attention events first: vLLM
puts a step's state-group events before its attention group's). A state group seen with no
hash at all (vLLM keeps no state on a prompt's first pass) still marks the instance hybrid.

vLLM does not de-duplicate: a block computed again while its hash is cached (a hybrid prompt
whose attention blocks hit but whose state did not) is a second block under the same hash, with
its own BlockStored and, later, its own BlockRemoved; the index counts copies per (group, hash).

What cannot be placed is counted, never guessed: a block whose parent this index does not know
(it missed the parent's event), a block size other than the instance's, and a state hash no
attention event named. Policy core: no sockets, no clock; the subscriber that feeds it lives
with the engine's integration.
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
        self._copies: dict[tuple[int, Hashable], int] = {}  # (group, engine hash) -> blocks
        self._any: dict[Hashable, int] = {}  # engine hash -> our hash (parents, any group)
        self._held: dict[int, _Held] = {}  # our hash -> groups holding it, by kind class
        self._kind_groups: dict[str, set[int]] = {"kv": set(), "state": set()}
        self._group_kind: dict[int, str] = {}

    @property
    def num_blocks(self) -> int:
        return sum(1 for h in self._held if self._present(h, "kv"))

    def apply(self, event: BlockEvent) -> None:
        self.apply_batch((event,))

    def apply_batch(self, events: Sequence[BlockEvent]) -> None:
        """One engine batch, in order. A state group's hashes are placed through the names the
        attention events give, this batch's included (module doc)."""
        ahead = self._names_ahead(events)
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event, ahead)
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
    def _lined_up(self, ev: BlockStored) -> bool:
        return len(ev.token_ids) == len(ev.block_hashes) * ev.block_size_tokens

    def _chain(self, ev: BlockStored, names: dict[Hashable, int]) -> list[int] | None:
        """Our hashes of a lined-up event's blocks, continued from its parent's; None when the
        parent has no name here."""
        if ev.parent_hash is None:
            seed = self.seed
        elif ev.parent_hash in self._any:
            seed = self._any[ev.parent_hash]
        elif ev.parent_hash in names:
            seed = names[ev.parent_hash]
        else:
            return None
        return chain_hashes(ev.token_ids, self.block_size_tokens, seed)

    def _names_ahead(self, events: Sequence[BlockEvent]) -> dict[Hashable, int]:
        """Engine hash -> our hash for the attention blocks this batch stores (only needed when
        the batch has a state group's event)."""
        names: dict[Hashable, int] = {}
        if not any(isinstance(e, BlockStored) and e.kind in STATE_KINDS for e in events):
            return names
        for ev in events:
            if isinstance(ev, BlockStored) and ev.kind not in STATE_KINDS and \
                    ev.block_size_tokens == self.block_size_tokens and self._lined_up(ev):
                ours = self._chain(ev, names)
                if ours is not None:
                    names.update(zip(ev.block_hashes, ours, strict=True))
        return names

    def _stored(self, ev: BlockStored, ahead: dict[Hashable, int]) -> None:
        n = len(ev.block_hashes)
        if ev.block_size_tokens != self.block_size_tokens:
            self.stats.unplaced_blocks += n
            return
        klass = "state" if ev.kind in STATE_KINDS else "kv"
        if ev.group not in self._kind_groups[klass]:
            self._learn_group(ev.group, klass)  # a state group with no hash still says hybrid
        ours: list[int | None]
        if klass == "state":  # by name: align mode's hashes need not line up with the tokens
            ours = [self._any.get(e, ahead.get(e)) for e in ev.block_hashes]
            if None in ours and self._lined_up(ev):
                ours = list(self._chain(ev, ahead) or ours)
        else:
            chained = self._chain(ev, ahead) if self._lined_up(ev) else None
            ours = list(chained) if chained is not None else [None] * n
        added: list[int] = []
        for engine_hash, h in zip(ev.block_hashes, ours, strict=True):
            if h is None:
                self.stats.unplaced_blocks += 1
                continue
            self.stats.stored_blocks += 1
            key = (ev.group, engine_hash)
            self._ours[key] = h
            self._copies[key] = self._copies.get(key, 0) + 1
            self._any[engine_hash] = h
            held = self._held.setdefault(h, _Held())
            before = self._present(h, "kv"), self._present(h, "state")
            held.groups.setdefault(klass, set()).add(ev.group)
            if (self._present(h, "kv"), self._present(h, "state")) != before:
                added.append(h)
        if added:
            blocks = [h for h in added if self._present(h, "kv")]
            self.listener.on_insert(self.pool_id, blocks, self._snapshots(added))

    def _removed(self, ev: BlockRemoved) -> None:
        lost: list[tuple[int, bool, bool]] = []
        for engine_hash in ev.block_hashes:
            key = (ev.group, engine_hash)
            h = self._ours.get(key)
            if h is None:
                self.stats.unknown_removed += 1
                continue
            self.stats.removed_blocks += 1
            self._copies[key] -= 1
            if self._copies[key]:  # another copy of the block is still cached
                continue
            del self._ours[key], self._copies[key]
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
        self._copies.clear()
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
