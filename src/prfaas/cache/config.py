"""Prefix-cache pool configuration and the snapshot-placement policy.

`PoolConfig` is validated at construction (negative sizes, unknown policies and a capacity
that cannot hold one request of `max_request_tokens` are rejected with the value named).
`snapshot_boundaries` says at which block boundaries a committed request leaves a
linear-attention / SWA state snapshot: every block, every k blocks, or only at the request's
end. The "end" is its last full-block boundary: a snapshot is only reusable at a block-aligned
length, so the engine checkpoints the state there (which is the true end when the request is
block aligned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from prfaas.core.errors import ConfigError

SnapshotPolicy = Literal["every_block", "every_k", "request_end"]
SNAPSHOT_POLICIES: tuple[str, ...] = get_args(SnapshotPolicy)


def _check_int(field_name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field_name, value, "must be an integer")
    if value < minimum:
        raise ConfigError(field_name, value, f"must be >= {minimum}")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool's settings. `capacity_bytes=None` means unlimited."""

    capacity_bytes: int | None = None
    block_size_tokens: int = 512
    snapshot_policy: SnapshotPolicy = "every_k"
    snapshot_every_k: int = 8
    # When set, the pool checks at construction that one request this long fits.
    max_request_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.capacity_bytes is not None:
            _check_int("capacity_bytes", self.capacity_bytes, 0)
        _check_int("block_size_tokens", self.block_size_tokens, 1)
        if self.snapshot_policy not in SNAPSHOT_POLICIES:
            raise ConfigError("snapshot_policy", self.snapshot_policy,
                              f"unknown; known: {', '.join(SNAPSHOT_POLICIES)}")
        _check_int("snapshot_every_k", self.snapshot_every_k, 1)
        if self.max_request_tokens is not None:
            _check_int("max_request_tokens", self.max_request_tokens, 1)


def snapshot_boundaries(num_blocks: int, policy: SnapshotPolicy, every_k: int = 1) -> list[int]:
    """Block counts (1..num_blocks) at whose boundary a request of `num_blocks` full blocks
    leaves a state snapshot; always includes `num_blocks` itself when it is positive."""
    if num_blocks <= 0:
        return []
    if policy == "every_block":
        return list(range(1, num_blocks + 1))
    if policy == "request_end":
        return [num_blocks]
    marks = list(range(every_k, num_blocks + 1, every_k))
    if not marks or marks[-1] != num_blocks:
        marks.append(num_blocks)
    return marks
