"""Longest usable prefix per pool, from a hash -> pool-bitmask index.

Two searches, same answer on indexes fed by `HybridPrefixPool`s:
- `exact_hits` assumes nothing: ANDs block masks along the chain (in C, via itertools), stops
  where no pool is left, then walks back once so each pool takes its longest boundary that
  also has a snapshot. Cost: one dict lookup per block of the request.
- `closed_hits` relies on the pool contract: a pool's blocks are prefix-closed (block i
  resident => blocks 0..i-1 resident) and a snapshot is resident only with its block. Then each
  pool's block-hit length is found by a binary search shared by all pools (a lookup answers for
  every pool at once; pools split where their answers differ), and the snapshot walk back
  starts at each pool's own length. Cost: about 8 lookups per distinct hit length + a few per
  snapshot gap, instead of one per block; dict lookups in a 1M-entry index are cache misses.
Results are lists indexed by pool bit: hit length in blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, compress, repeat
from operator import and_

Index = dict[int, int]  # block hash -> bitmask of pools


def _assign(hits: list[int], mask: int, value: int) -> None:
    while mask:
        low = mask & -mask
        hits[low.bit_length() - 1] = value
        mask ^= low


def exact_hits(kv: Index | None, snap: Index | None, hashes: Sequence[int],
               num_pools: int) -> list[int]:
    """Per pool, the longest i such that blocks 0..i-1 are in `kv` and a snapshot after block
    i-1 is in `snap` (None = that kind is not needed)."""
    if kv is None:
        assert snap is not None
        candidates = list(map(snap.get, hashes, repeat(0)))
    else:
        candidates = list(accumulate(map(kv.get, hashes, repeat(0)), and_))
        if candidates and not candidates[-1]:
            del candidates[candidates.index(0):]
        if snap is not None:
            candidates = list(map(and_, candidates, map(snap.get, hashes, repeat(0))))
    hits = [0] * num_pools
    remaining = (1 << num_pools) - 1
    for i in reversed(list(compress(range(len(candidates)), candidates))):
        found = candidates[i] & remaining
        if found:
            remaining ^= found
            _assign(hits, found, i + 1)
            if not remaining:
                break
    return hits


def _block_lengths(kv: Index, hashes: Sequence[int], num_pools: int) -> dict[int, int]:
    """Block-hit length -> mask of pools with that length (length > 0 only), assuming each
    pool's blocks are prefix-closed."""
    groups: dict[int, int] = {}
    if not hashes:
        return groups
    get = kv.get
    first = get(hashes[0], 0)
    stack = [(1, len(hashes), first)] if first else []  # pools in mask have lo <= len <= hi
    while stack:
        lo, hi, mask = stack.pop()
        if lo == hi:
            groups[lo] = groups.get(lo, 0) | mask
            continue
        mid = (lo + hi + 1) // 2
        longer = get(hashes[mid - 1], 0) & mask  # pools that hold block mid-1: len >= mid
        if longer:
            stack.append((mid, hi, longer))
        if longer != mask:
            stack.append((lo, mid - 1, mask & ~longer))
    return groups


def closed_hits(kv: Index, snap: Index | None, hashes: Sequence[int],
                num_pools: int) -> list[int]:
    """Same answer as `exact_hits` for prefix-closed pools (see module doc)."""
    hits = [0] * num_pools
    groups = _block_lengths(kv, hashes, num_pools)
    if snap is None:
        for length, mask in groups.items():
            _assign(hits, mask, length)
        return hits
    levels = sorted(groups, reverse=True)
    get = snap.get
    pending = 0  # pools whose block length exceeds i and that have not found a snapshot yet
    k = 0
    i = levels[0] - 1 if levels else -1
    while i >= 0:
        while k < len(levels) and levels[k] > i:
            pending |= groups[levels[k]]
            k += 1
        if not pending:
            if k == len(levels):
                break
            i = levels[k] - 1  # jump to the next shorter group's last block
            continue
        found = get(hashes[i], 0) & pending
        if found:
            _assign(hits, found, i + 1)
            pending ^= found
        i -= 1
    return hits
