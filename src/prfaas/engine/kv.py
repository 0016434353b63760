"""A sequence's KV cache: paged blocks for attention layers, states + snapshots for linear layers.

- `AttnStore` (mla / gqa / swa): rows in fixed blocks of `block_size` tokens. Full blocks are
  never written again, so a prefix view at a block boundary shares them without copying; only
  the partly filled tail block is written (by its one owner).
- `LinearStore` (kda): the recurrent + conv state at `num_tokens`, plus snapshots at block
  boundaries (a linear state is reusable only at exactly the cached length). States are
  replaced, never modified in place, so snapshots can share them.
- `LayerKV` is one layer's KV for a token range: what a prefill hook receives and what crosses
  the wire. Full attention: the rows of [start, end). Linear: the state at `end`. SWA: the last
  min(window, end) rows before `end` (all a continuation needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prfaas.core.errors import ConfigError

ATTN_KINDS = ("mla", "gqa", "swa")


@dataclass
class LayerKV:
    layer_index: int
    kind: str  # "mla" | "gqa" | "swa" | "linear"
    start_token: int
    end_token: int
    tensors: dict[str, torch.Tensor]  # mla {"latent", "k_rope"}; gqa/swa {"k", "v"};
    # linear {"state" [H, dk, dv], "conv" [kernel-1, channels]}

    def byte_size(self) -> int:
        """Bytes as shipped: float32 on the wire (a bf16 engine's KV widens to it)."""
        return sum(t.numel() * (4 if t.is_floating_point() else t.element_size())
                   for t in self.tensors.values())


class AttnStore:
    """Paged rows of one attention layer; token `first_token + i` lives at row i."""

    def __init__(self, kind: str, block_size: int, window: int = 0, first_token: int = 0) -> None:
        self.kind, self.block_size, self.window = kind, block_size, window
        self.first_token = first_token
        self.num_tokens = first_token
        self.blocks: list[dict[str, torch.Tensor]] = []

    def append(self, rows: dict[str, torch.Tensor]) -> None:
        """Rows in the rows' own device and dtype. Whole blocks at a block boundary are one
        copy (block views into it; full blocks are never written again), so a GPU prefill of
        8192 tokens costs one copy per tensor, not one per 64-token block; a partial tail block
        is its own tensor, written in place until full."""
        count = next(iter(rows.values())).shape[0]
        done = 0
        while done < count:
            offset = (self.num_tokens - self.first_token) % self.block_size
            whole = (count - done) // self.block_size
            if offset == 0 and whole >= 2:
                span = whole * self.block_size
                bulk = {name: t[done:done + span].reshape(whole, self.block_size, *t.shape[1:])
                        .clone() for name, t in rows.items()}
                self.blocks.extend({name: b[i] for name, b in bulk.items()}
                                   for i in range(whole))
                done += span
                self.num_tokens += span
                continue
            if offset == 0:
                self.blocks.append({name: torch.empty(self.block_size, *t.shape[1:],
                                                      dtype=t.dtype, device=t.device)
                                    for name, t in rows.items()})
            take = min(self.block_size - offset, count - done)
            for name, t in rows.items():
                self.blocks[-1][name][offset:offset + take] = t[done:done + take]
            done += take
            self.num_tokens += take

    def gather(self, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Rows of tokens [lo, hi) as contiguous tensors."""
        if lo < self.first_token or hi > self.num_tokens or lo > hi:
            raise ConfigError("token_range", (lo, hi),
                              f"store holds [{self.first_token}, {self.num_tokens})")
        if lo == hi or not self.blocks:
            return {n: t[:0] for n, t in (self.blocks[0] if self.blocks else {}).items()}
        b_lo = (lo - self.first_token) // self.block_size
        b_hi = -(-(hi - self.first_token) // self.block_size)
        skip = lo - self.first_token - b_lo * self.block_size
        return {name: torch.cat([b[name] for b in self.blocks[b_lo:b_hi]])[skip:skip + hi - lo]
                for name in self.blocks[0]}

    def prefix(self, num_tokens: int) -> AttnStore:
        out = AttnStore(self.kind, self.block_size, self.window, self.first_token)
        full = (num_tokens - self.first_token) // self.block_size
        out.blocks = self.blocks[:full]  # shared: full blocks are immutable
        out.num_tokens = self.first_token + full * self.block_size
        if out.num_tokens < num_tokens:  # unaligned (imported SWA tail): copy the partial rows
            out.append(self.gather(out.num_tokens, num_tokens))
        return out

    def export(self, start: int, end: int) -> dict[str, torch.Tensor]:
        if self.kind == "swa":
            start = max(self.first_token, end - self.window)
        return self.gather(start, end)

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for b in self.blocks for t in b.values())


class LinearStore:
    """The state of one linear layer at `num_tokens`, with block-boundary snapshots."""

    def __init__(self, state: dict[str, torch.Tensor], num_tokens: int = 0,
                 snapshot_every_tokens: int = 0) -> None:
        self.state = state
        self.num_tokens = num_tokens
        self.snapshot_every_tokens = snapshot_every_tokens
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def advance(self, state: dict[str, torch.Tensor], num_tokens: int) -> None:
        """Replace the state (now at `num_tokens`), snapshotting at boundaries. The tensors are
        cloned into the snapshot so a batched decode's stacked tensor is not kept alive."""
        self.state, self.num_tokens = state, num_tokens
        every = self.snapshot_every_tokens
        if every and num_tokens % every == 0:
            self.snapshots[num_tokens] = {n: t.clone() for n, t in state.items()}

    def state_at(self, num_tokens: int) -> dict[str, torch.Tensor]:
        if num_tokens == self.num_tokens:
            return self.state
        if num_tokens in self.snapshots:
            return self.snapshots[num_tokens]
        raise ConfigError("num_tokens", num_tokens, "no linear-state snapshot at this length")

    def prefix(self, num_tokens: int) -> LinearStore:
        out = LinearStore(self.state_at(num_tokens), num_tokens, self.snapshot_every_tokens)
        out.snapshots = {n: s for n, s in self.snapshots.items() if n <= num_tokens}
        return out

    def held_bytes(self) -> int:
        states = [self.state, *self.snapshots.values()]
        return sum(t.numel() * t.element_size() for s in states for t in s.values())


Store = AttnStore | LinearStore


class SequenceKV:
    """One sequence's whole cache: one store per layer, all at `num_tokens`."""

    def __init__(self, stores: list[Store], token_ids: list[int] | None = None) -> None:
        self.stores = stores
        self.token_ids = token_ids  # None when the tokens are unknown (imported without them)

    @property
    def num_tokens(self) -> int:
        return self.stores[0].num_tokens if self.stores else 0

    def export(self, start_token: int, end_token: int) -> list[LayerKV]:
        """What a sender ships so a receiver holding [0, start) can continue at end_token."""
        if not 0 <= start_token <= end_token <= self.num_tokens:
            raise ConfigError("token_range", (start_token, end_token),
                              f"must lie within [0, {self.num_tokens}]")
        return [self.export_layer(i, start_token, end_token) for i in range(len(self.stores))]

    def export_layer(self, index: int, start: int, end: int) -> LayerKV:
        store = self.stores[index]
        if isinstance(store, LinearStore):
            return LayerKV(index, "linear", start, end, dict(store.state_at(end)))
        tensors = store.export(start, end)
        first = end - next(iter(tensors.values())).shape[0] if tensors else start
        return LayerKV(index, store.kind, first, end, tensors)

    def snapshot_at(self, num_tokens: int) -> SequenceKV:
        """The prefix of the first `num_tokens` tokens (a block boundary, or the full length)."""
        if not 0 < num_tokens <= self.num_tokens:
            raise ConfigError("num_tokens", num_tokens, f"must be in (0, {self.num_tokens}]")
        ids = None if self.token_ids is None else self.token_ids[:num_tokens]
        return SequenceKV([s.prefix(num_tokens) for s in self.stores], ids)

    def byte_size(self) -> int:
        """Bytes of the whole cache as shipped (export(0, num_tokens)): S_kv(num_tokens)."""
        return sum(layer.byte_size() for layer in self.export(0, self.num_tokens))

    def held_bytes(self) -> int:
        """Bytes held in memory: whole blocks, SWA history and linear snapshots included."""
        return sum(s.held_bytes() for s in self.stores)
