"""The emulated engine: the workers' engine interface (engine/base.py) with compute replaced
by sleeps.

- prefill: T'_prefill(total, cached) seconds from the hardware profile (already in live units,
  scales.py), spent layer by layer: layer i's KV is handed to the hook when (i + 1) / L of the
  time has passed, as the simulator's layer-wise overlap assumes (the last layer's share goes
  after the prefill). The thread sleeps: no CPU is burnt.
- KV: real float32 tensors of the layout's widths (layout.py) whose values are a function of
  the prompt (full attention: of each token id and position; linear: of the prefix's digest),
  so a prefill resumed from a cached prefix yields the same bytes as one from scratch.
- tokens: output token k is a function of a digest (CRC-32) of the request's whole KV and k.
  The prefill node takes the first token from its own KV; the decode node derives the others
  from the KV it imported, so a request whose KV was corrupted, truncated or swapped with
  another's produces other tokens than `generate` does.
- decode: one step sleeps T'_step(batch); the KV is not extended during decode (nothing reads
  it), only the token list.
- `slowdown` (a negative control, backend.py's `control_slowdown`): every sleep that factor
  longer than the profile says.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import numpy as np
import torch

from prfaas.core.errors import ConfigError
from prfaas.emulated.layout import EmulatedLayout
from prfaas.engine.base import DecodeSeq, EngineBase, PrefillResult
from prfaas.engine.kv import AttnStore, LayerKV, LinearStore, SequenceKV, Store
from prfaas.engine.sampling import SamplingParams
from prfaas.models.engine_config import EngineConfig
from prfaas.models.profile import DecodeTime, PrefillTime

_MOD = 16_777_213  # < 2**24: every payload value is an exact float32 integer
_LOGIT = 1e4


class RowStore(AttnStore):
    """A full-attention store of contiguous rows (no paging: emulated prompts are not cut into
    cached blocks), with AttnStore's interface."""

    def __init__(self, first_token: int = 0) -> None:
        super().__init__("mla", 1, 0, first_token)
        self.rows: torch.Tensor | None = None

    def append(self, rows: dict[str, torch.Tensor]) -> None:
        new = rows["rows"]
        self.rows = new if self.rows is None else torch.cat([self.rows, new])
        self.num_tokens += new.shape[0]

    def gather(self, lo: int, hi: int) -> dict[str, torch.Tensor]:
        if lo < self.first_token or hi > self.num_tokens or lo > hi:
            raise ConfigError("token_range", (lo, hi),
                              f"store holds [{self.first_token}, {self.num_tokens})")
        rows = self.rows if self.rows is not None else torch.empty(0, 0)
        return {"rows": rows[lo - self.first_token:hi - self.first_token]}

    def prefix(self, num_tokens: int) -> RowStore:
        out = RowStore(self.first_token)
        if num_tokens > self.first_token:
            out.append(self.gather(self.first_token, num_tokens))
        return out

    def held_bytes(self) -> int:
        return 0 if self.rows is None else self.rows.numel() * 4


class EmulatedKV(SequenceKV):
    """A SequenceKV that remembers the digest its tokens derive from."""

    digest: int = 0


def token_of(digest: int, step: int) -> int:
    """Output token `step` (0 = the prefill's) of a request whose KV has `digest`: a byte value,
    never BOS/EOS, so outputs always run to max_tokens."""
    x = (digest * 0x9E3779B1 + (step + 1) * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 15
    return (x * 0x2C1B3C6D & 0xFFFFFFFF) >> 24


def _layer_crc(kv: SequenceKV, index: int, crc: int) -> int:
    layer = kv.export_layer(index, 0, kv.stores[index].num_tokens)
    for name in sorted(layer.tensors):
        crc = zlib.crc32(layer.tensors[name].contiguous().numpy().tobytes(), crc)
    return crc


def kv_digest(kv: SequenceKV) -> int:
    """CRC-32 of the whole KV (every layer from token 0, in layer order)."""
    crc = 0
    for i in range(len(kv.stores)):
        crc = _layer_crc(kv, i, crc)
    return crc


def attention_rows(token_ids: list[int], start: int, end: int, layer: int, width: int
                   ) -> torch.Tensor:
    """[end - start, width] float32: a function of each token id, its position and the layer."""
    tok = np.asarray(token_ids[start:end], dtype=np.int64)[:, None]
    pos = np.arange(start, end, dtype=np.int64)[:, None]
    col = np.arange(width, dtype=np.int64)[None, :]
    vals = (tok * 2_654_435 + pos * 40_503 + layer * 9_973 + col * 31) % _MOD
    return torch.from_numpy(vals.astype(np.float32))


def linear_state(token_ids: list[int], end: int, layer: int, width: int) -> torch.Tensor:
    """[width] float32: a function of the digest of tokens [0, end) and the layer."""
    seed = zlib.crc32(np.asarray(token_ids[:end], dtype=np.int32).tobytes()) ^ (layer * 7919)
    vals = (seed + np.arange(width, dtype=np.int64) * 2_654_435) % _MOD
    return torch.from_numpy(vals.astype(np.float32))


class EmulatedEngine(EngineBase):
    """Engine interface, emulated compute (see the module docstring). `prefill_time` and
    `decode_time` are in live seconds; a worker whose role needs one that is None fails at
    construction in backend.py, not here."""

    def __init__(self, layout: EmulatedLayout, config: EngineConfig,
                 prefill_time: PrefillTime | None, decode_time: DecodeTime | None,
                 sleep: Callable[[float], None] = time.sleep,
                 now: Callable[[], float] = time.perf_counter, slowdown: float = 1.0) -> None:
        super().__init__(config)
        self.layout = layout
        self.prefill_time, self.decode_time = prefill_time, decode_time
        self._sleep, self._now = sleep, now
        self.slowdown = slowdown

    def new_kv(self) -> SequenceKV:
        stores: list[Store] = [RowStore() if k == "M" else LinearStore({}, 0, 0)
                               for k in self.layout.pattern]
        return EmulatedKV(stores, [])

    def prefill(self, token_ids: list[int], prefix: SequenceKV | None = None,
                on_layer: Callable[[LayerKV], None] | None = None,
                all_logits: bool = False) -> PrefillResult:
        """`all_logits`: the prompt positions' logits are uniform (zeros): an emulated model
        predicts nothing about the prompt."""
        self._check_prompt(token_ids)
        start = self._check_prefix(token_ids, prefix)
        if self.prefill_time is None:
            raise ConfigError("engine", "prefill", "this emulated worker has no prefill profile")
        seconds = self.prefill_time.seconds(len(token_ids), start) * self.slowdown
        base = prefix.snapshot_at(start) if prefix is not None else self.new_kv()
        kv = EmulatedKV(base.stores, list(token_ids))
        end, n = len(token_ids), self.layout.num_layers
        t0 = self._now()
        crc = 0
        for i, width in enumerate(self.layout.widths):
            store = kv.stores[i]
            if isinstance(store, RowStore):
                store.append({"rows": attention_rows(token_ids, start, end, i, width)})
            elif isinstance(store, LinearStore):
                store.advance({"state": linear_state(token_ids, end, i, width)}, end)
            # the emulation's own work (payload, digest) happens inside the layer's time
            crc = _layer_crc(kv, i, crc)
            self._sleep(max(t0 + seconds * (i + 1) / n - self._now(), 0.0))
            if on_layer is not None:
                on_layer(kv.export_layer(i, start, end))
        kv.digest = crc
        first = token_of(kv.digest, 0)
        logits = torch.zeros(self.config.vocab_size)
        logits[first] = _LOGIT
        prompt_logits = torch.zeros(end - start, self.config.vocab_size) if all_logits else None
        return PrefillResult(kv, logits, first, end - start, prompt_logits)

    def import_kv(self, layers: list[LayerKV], prefix: SequenceKV | None = None,
                  token_ids: list[int] | None = None) -> SequenceKV:
        if len(layers) != self.layout.num_layers:
            raise ConfigError("layers", len(layers), f"expected {self.layout.num_layers} layers")
        base = prefix.num_tokens if prefix is not None else 0
        old = prefix.snapshot_at(base).stores if prefix is not None and base else None
        stores: list[Store] = []
        for i, layer in enumerate(sorted(layers, key=lambda x: x.layer_index)):
            stores.append(self._import_layer(i, layer, base, old[i] if old else None))
        if len({s.num_tokens for s in stores}) != 1:
            raise ConfigError("layers", sorted({s.num_tokens for s in stores}),
                              "layers end at different tokens")
        kv = EmulatedKV(stores, list(token_ids) if token_ids is not None else None)
        kv.digest = kv_digest(kv)
        return kv

    def _import_layer(self, i: int, layer: LayerKV, base: int, old: Store | None) -> Store:
        kind = "linear" if self.layout.pattern[i] == "K" else "mla"
        if layer.layer_index != i or layer.kind != kind:
            raise ConfigError(f"layers[{i}]", (layer.layer_index, layer.kind),
                              f"expected layer {i} of kind {kind}")
        width = self.layout.widths[i]
        if kind == "linear":
            state = layer.tensors.get("state")
            if state is None or tuple(state.shape) != (width,):
                raise ConfigError(f"layers[{i}].state", None if state is None else
                                  tuple(state.shape), f"expected shape ({width},)")
            return LinearStore({"state": state}, layer.end_token, 0)
        rows = layer.tensors.get("rows")
        if rows is None or rows.ndim != 2 or rows.shape[1] != width \
                or rows.shape[0] != layer.end_token - layer.start_token:
            raise ConfigError(f"layers[{i}].rows", None if rows is None else tuple(rows.shape),
                              f"expected [{layer.end_token - layer.start_token}, {width}]")
        if layer.start_token != base:
            raise ConfigError(f"layers[{i}].start_token", layer.start_token,
                              f"must equal the cached prefix length {base}")
        store = old if isinstance(old, RowStore) else RowStore()
        store.append({"rows": rows})
        return store

    def decode_step(self, batch: list[DecodeSeq]) -> list[int]:
        if not batch:
            return []
        if self.decode_time is None:
            raise ConfigError("engine", "decode", "this emulated worker has no decode profile")
        t0 = self._now()
        tokens = []
        for seq in batch:
            if seq.kv.token_ids is not None:
                seq.kv.token_ids.append(seq.last_token)
            token = token_of(getattr(seq.kv, "digest", 0), seq.step)
            seq.last_token, seq.step = token, seq.step + 1
            tokens.append(token)
        step_s = self.decode_time.step_at(len(batch)) * self.slowdown
        self._sleep(max(t0 + step_s - self._now(), 0.0))
        return tokens

    def generate(self, token_ids: list[int], max_tokens: int,
                 sampling: SamplingParams | None = None) -> list[int]:
        """The reference output: the tokens the live path must reproduce (no sleeping)."""
        if max_tokens <= 0:
            raise ConfigError("max_tokens", max_tokens, "must be positive")
        saved, self._sleep = self._sleep, lambda _: None
        try:
            digest = getattr(self.prefill(token_ids).kv, "digest", 0)
        finally:
            self._sleep = saved
        return [token_of(digest, k) for k in range(max_tokens)]
