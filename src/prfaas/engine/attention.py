"""Attention mixers: MLA (caches latent + rope key) and GQA / SWA (caches k, v).

Every mixer has the same three entry points:
- `prefill_chunk(x [C, D], start, store, work)`: one block-aligned chunk; appends its KV to the
  store. `work` holds this prefill call's contiguous key/value buffers, rebuilt from the cached
  prefix block by block, so a resumed prefill runs the same operations on the same shapes as a
  from-scratch one (bitwise-equal results).
  Attention mixers split it in two, because what they cache (MLA latent + rope key, GQA/SWA
  k, v) is a projection of the layer's input alone: `project_chunk` computes and appends a
  chunk's cached KV (final from then on), `attend_chunk` runs that chunk's attention. The
  layer-major prefill (model.Block) projects every chunk first, emits the layer's KV, then
  attends, so the KV can leave before the layer's attention and MLP have run.
- `decode(x [B, D], stores, positions [B])`: one token per sequence (continuous batching).
- `forward_full(x [T, D])`: the plain reference forward (no cache, no chunks), for checks
  and benchmarks.
Every tensor a mixer makes is made on its weights' device and in their dtype. With
`fused_attention` (HybridLM sets it on a GPU) MLA and full GQA attend through
ops.fused_causal_attention (flash / memory-efficient kernels, no [heads, chunk, context]
scores); without it, through the explicit ops.causal_attention the CPU engine's bits rely on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from prfaas.engine.kv import AttnStore, Store
from prfaas.engine.ops import apply_rope, causal_attention, fused_causal_attention, proj, rms_norm
from prfaas.models.engine_config import EngineConfig

Work = dict[str, Any]
QUERY_TILE = 64  # forward_full query tile: bounds the score matrix, keeps it in cache


class Rope:
    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, self.cos[positions], self.sin[positions])


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape), requires_grad=False)


def _buffers(work: Work, lead: int, shapes: dict[str, tuple[int, ...]],
             like: torch.Tensor) -> dict[str, Any]:
    if "buf" not in work:
        work["buf"] = {n: torch.zeros(lead, *s, dtype=like.dtype, device=like.device)
                       for n, s in shapes.items()}
    return work["buf"]


def _positions(start: int, end: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(start, end, device=like.device)


class ProjectThenAttend(ABC):
    """The two-step chunk of an attention mixer: `project_chunk` computes and appends what the
    layer caches (final from then on), `attend_chunk` runs the chunk's attention."""

    fused_attention = False  # ops.fused_causal_attention instead of the explicit form (GPUs)

    @abstractmethod
    def cache_of(self, x: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """What this layer caches for tokens `x` at positions `pos`."""

    @abstractmethod
    def attend_chunk(self, x: torch.Tensor, start: int, store: Store, work: Work,
                     cached: dict[str, torch.Tensor]) -> torch.Tensor:
        """The chunk's attention output, given its own cached projections."""

    def prefill_chunk(self, x: torch.Tensor, start: int, store: Store, work: Work,
                      ) -> torch.Tensor:
        return self.attend_chunk(x, start, store, work,
                                 self.project_chunk(x, start, store, work))

    def project_chunk(self, x: torch.Tensor, start: int, store: Store, work: Work,
                      ) -> dict[str, torch.Tensor]:
        """Append the chunk's cached KV to the store; returns it for attend_chunk."""
        assert isinstance(store, AttnStore)
        work.setdefault("cached_tokens", start)  # the prefix this call resumes from
        cached = self.cache_of(x, _positions(start, start + x.shape[0], x))
        store.append(cached)
        return cached


class MLA(nn.Module, ProjectThenAttend):
    kind = "mla"

    def __init__(self, cfg: EngineConfig, rope: Rope) -> None:
        super().__init__()
        h, dn, dr, r = cfg.num_heads, cfg.head_dim, cfg.rope_head_dim, cfg.kv_lora_rank
        self.h, self.dn, self.dr, self.r, self.rope = h, dn, dr, r, rope
        self.block_size = cfg.block_size_tokens
        self.wq = _param(h * (dn + dr), cfg.hidden)
        self.w_dkv = _param(r, cfg.hidden)
        self.kv_norm = _param(r)
        self.w_kr = _param(dr, cfg.hidden)
        self.w_uk = _param(h * dn, r)
        self.w_uv = _param(h * dn, r)
        self.wo = _param(cfg.hidden, h * dn)

    def new_store(self) -> AttnStore:
        return AttnStore("mla", self.block_size)

    def _q(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = proj(x, self.wq).view(x.shape[0], self.h, self.dn + self.dr)
        return torch.cat((q[..., :self.dn], self.rope.at(q[..., self.dn:], pos)), dim=-1)

    def cache_of(self, x: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """What is cached: the latent [n, r] and the rope key [n, dr] (shared by all heads)."""
        return {"latent": rms_norm(proj(x, self.w_dkv), self.kv_norm),
                "k_rope": self.rope.at(proj(x, self.w_kr), pos)}

    def _qkv_latent(self, x: torch.Tensor, pos: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cached = self.cache_of(x, pos)
        return self._q(x, pos), cached["latent"], cached["k_rope"]

    def _up(self, latent: torch.Tensor, k_rope: torch.Tensor,
            ) -> tuple[torch.Tensor, torch.Tensor]:
        n = latent.shape[0]
        k_nope = proj(latent, self.w_uk).view(n, self.h, self.dn)
        k = torch.cat((k_nope, k_rope[:, None, :].expand(n, self.h, self.dr)), dim=-1)
        return k, proj(latent, self.w_uv).view(n, self.h, self.dn)

    def _fill(self, buf: dict[str, torch.Tensor], start: int, latent: torch.Tensor,
              k_rope: torch.Tensor) -> None:
        k, v = self._up(latent, k_rope)
        buf["k"][:, start:start + k.shape[0]] = k.transpose(0, 1)
        buf["v"][:, start:start + v.shape[0], :self.dn] = v.transpose(0, 1)

    def attend_chunk(self, x: torch.Tensor, start: int, store: Store, work: Work,
                     cached: dict[str, torch.Tensor]) -> torch.Tensor:
        assert isinstance(store, AttnStore)
        c, end = x.shape[0], start + x.shape[0]
        # head-major [H, T, d] buffers: [:, :end] is a plain strided operand, no copy per chunk
        # fused: v as wide as k (zero columns past dn), so the flash kernel's equal head sizes
        # hold without a per-chunk copy (ops.fused_causal_attention)
        v_width = self.dn + self.dr if self.fused_attention else self.dn
        buf = _buffers(work, self.h, {"k": (work["total"], self.dn + self.dr),
                                      "v": (work["total"], v_width)}, x)
        if "filled" not in work:  # up-project the cached prefix block by block, like a chunk
            # (only the prefix blocks: the store may already hold this call's projected chunks)
            for i, block in enumerate(store.blocks[:work["cached_tokens"] // self.block_size]):
                self._fill(buf, i * self.block_size, block["latent"], block["k_rope"])
            work["filled"] = True
        self._fill(buf, start, cached["latent"], cached["k_rope"])
        q = self._q(x, _positions(start, end, x))
        if self.fused_attention:
            o = fused_causal_attention(q.transpose(0, 1), buf["k"][:, :end],
                                       buf["v"][:, :end])[..., :self.dn]
        else:
            o = causal_attention(q.transpose(0, 1), buf["k"][:, :end], buf["v"][:, :end],
                                 start, 0)  # [H, C, dv]
        return proj(o.transpose(0, 1).reshape(c, self.h * self.dn), self.wo)

    def decode(self, x: torch.Tensor, stores: list[Store], positions: torch.Tensor,
               ) -> torch.Tensor:
        """Absorbed MLA: attend in latent space, so a step costs O(length * rank)."""
        b = x.shape[0]
        q, latent, k_rope = self._qkv_latent(x, positions)
        w_uk = self.w_uk.view(self.h, self.dn, self.r)
        q_lat = torch.stack([proj(q[:, i, :self.dn], w_uk[i].T) for i in range(self.h)], dim=1)
        scale = (self.dn + self.dr) ** -0.5
        ctx = []
        for i, store in enumerate(stores):
            assert isinstance(store, AttnStore)
            store.append({"latent": latent[i:i + 1], "k_rope": k_rope[i:i + 1]})
            cached = store.gather(0, store.num_tokens)
            scores = (q_lat[i] @ cached["latent"].T + q[i, :, self.dn:] @ cached["k_rope"].T)
            ctx.append(torch.softmax(scores * scale, dim=-1) @ cached["latent"])  # [H, r]
        ctx_lat = torch.stack(ctx)  # [B, H, r]
        w_uv = self.w_uv.view(self.h, self.dn, self.r)
        o = torch.stack([proj(ctx_lat[:, i], w_uv[i]) for i in range(self.h)], dim=1)
        return proj(o.reshape(b, self.h * self.dn), self.wo)

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, latent, k_rope = self._qkv_latent(x, _positions(0, t, x))
        k, v = self._up(latent, k_rope)
        o = _tiled_attention(q, k, v, 0)
        return proj(o.reshape(t, self.h * self.dn), self.wo)


class GQA(nn.Module, ProjectThenAttend):
    """Grouped-query attention; with window > 0 it is sliding-window attention (SWA)."""

    def __init__(self, cfg: EngineConfig, rope: Rope, window: int = 0) -> None:
        super().__init__()
        self.kind = "swa" if window else "gqa"
        self.h, self.kvh, self.d, self.window, self.rope = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, window, rope)
        self.block_size = cfg.block_size_tokens
        self.wq = _param(self.h * self.d, cfg.hidden)
        self.wk = _param(self.kvh * self.d, cfg.hidden)
        self.wv = _param(self.kvh * self.d, cfg.hidden)
        self.wo = _param(cfg.hidden, self.h * self.d)

    def new_store(self) -> AttnStore:
        return AttnStore(self.kind, self.block_size, self.window)

    def _q(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.rope.at(proj(x, self.wq).view(x.shape[0], self.h, self.d), pos)

    def cache_of(self, x: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """What is cached: k (roped) and v, each [n, kvh, d]."""
        n = x.shape[0]
        return {"k": self.rope.at(proj(x, self.wk).view(n, self.kvh, self.d), pos),
                "v": proj(x, self.wv).view(n, self.kvh, self.d)}

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cached = self.cache_of(x, pos)
        return self._q(x, pos), cached["k"], cached["v"]

    def _heads(self, kv: torch.Tensor) -> torch.Tensor:
        """[N, kvh, d] -> [H, N, d] (each kv head serves H / kvh query heads)."""
        return kv.repeat_interleave(self.h // self.kvh, dim=1).transpose(0, 1)

    def _heads_buf(self, kv: torch.Tensor) -> torch.Tensor:
        """[kvh, N, d] -> [H, N, d]."""
        return kv.repeat_interleave(self.h // self.kvh, dim=0)

    def _key_start(self, start: int, first: int = 0) -> int:
        return max(first, start - self.window + 1) if self.window else first

    def attend_chunk(self, x: torch.Tensor, start: int, store: Store, work: Work,
                     cached: dict[str, torch.Tensor]) -> torch.Tensor:
        assert isinstance(store, AttnStore)
        c, end = x.shape[0], start + x.shape[0]
        buf = _buffers(work, self.kvh, {"k": (work["total"], self.d),
                                        "v": (work["total"], self.d)}, x)
        if "filled" not in work:  # copy the cached prefix rows this prefill can still attend to
            first = work["cached_tokens"]
            lo = self._key_start(first, store.first_token)
            rows = store.gather(lo, first)
            for name in ("k", "v"):
                buf[name][:, lo:first] = rows[name].transpose(0, 1) if rows else 0.0
            work["filled"] = True
        k, v = cached["k"], cached["v"]
        buf["k"][:, start:end], buf["v"][:, start:end] = k.transpose(0, 1), v.transpose(0, 1)
        q = self._q(x, _positions(start, end, x))
        lo, rep = self._key_start(start), self.h // self.kvh
        if self.fused_attention and not self.window:  # heads of a kv head share its k, v
            o = fused_causal_attention(q.transpose(0, 1), self._heads_buf(buf["k"][:, :end]),
                                       self._heads_buf(buf["v"][:, :end]))
            return proj(o.transpose(0, 1).reshape(c, self.h * self.d), self.wo)
        # query heads sharing a kv head attend together: [kvh, rep * C, d], no K/V repeat
        grouped = q.transpose(0, 1).reshape(self.kvh, rep * c, self.d)
        o = causal_attention(grouped, buf["k"][:, lo:end], buf["v"][:, lo:end], start, lo,
                             self.window, q_repeat=rep)
        return proj(o.reshape(self.h, c, self.d).transpose(0, 1).reshape(c, self.h * self.d),
                    self.wo)

    def decode(self, x: torch.Tensor, stores: list[Store], positions: torch.Tensor,
               ) -> torch.Tensor:
        q, k, v = self._qkv(x, positions)
        outs = []
        for i, store in enumerate(stores):
            assert isinstance(store, AttnStore)
            store.append({"k": k[i:i + 1], "v": v[i:i + 1]})
            pos = store.num_tokens - 1
            lo = self._key_start(pos, store.first_token)
            cached = store.gather(lo, pos + 1)
            outs.append(causal_attention(q[i][:, None], self._heads(cached["k"]),
                                         self._heads(cached["v"]), pos, lo, self.window))
        o = torch.stack(outs)[:, :, 0]  # [B, H, d]
        return proj(o.reshape(x.shape[0], self.h * self.d), self.wo)

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self._qkv(x, _positions(0, t, x))
        o = _tiled_attention(q, k.repeat_interleave(self.h // self.kvh, dim=1),
                             v.repeat_interleave(self.h // self.kvh, dim=1), self.window)
        return proj(o.reshape(t, self.h * self.d), self.wo)


def _tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int) -> torch.Tensor:
    """Causal attention over a whole sequence, q/k/v [T, H, d] -> [T, H, dv]."""
    outs = []
    for lo in range(0, q.shape[0], QUERY_TILE):
        hi = min(lo + QUERY_TILE, q.shape[0])
        k_lo = max(0, lo - window + 1) if window else 0
        outs.append(causal_attention(q[lo:hi].transpose(0, 1), k[k_lo:hi].transpose(0, 1),
                                     v[k_lo:hi].transpose(0, 1), lo, k_lo, window))
    return torch.cat(outs, dim=1).transpose(0, 1)
