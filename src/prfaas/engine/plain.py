"""The plain decode baseline: the same model and weights, batched decode over equal-length
sequences with contiguous preallocated caches, no paging, no snapshots, no per-sequence loops.

It exists to price the serving bookkeeping (`benchmarks/bench_engine.py`) and as a numerical
cross-check of the engine's decode (close, not bitwise: other association orders).
"""

from __future__ import annotations

import torch

from prfaas.engine.attention import GQA, MLA
from prfaas.engine.kda import kda_recurrent_step
from prfaas.engine.kda_layer import KDA, _conv
from prfaas.engine.kv import AttnStore, LinearStore, SequenceKV
from prfaas.engine.model import HybridLM
from prfaas.engine.ops import proj, rms_norm

Cache = dict[str, torch.Tensor]


class PlainDecoder:
    """Decode B sequences of the same length together; caches are [B, capacity, ...]."""

    def __init__(self, model: HybridLM, seqs: list[SequenceKV], extra_tokens: int) -> None:
        self.model = model
        self.pos = seqs[0].num_tokens
        if any(s.num_tokens != self.pos for s in seqs):
            raise ValueError("PlainDecoder needs sequences of equal length")
        cap = self.pos + extra_tokens
        self.caches = [self._dense(i, [s.stores[i] for s in seqs], cap)
                       for i in range(len(model.blocks))]

    def _dense(self, i: int, stores: list[AttnStore | LinearStore], cap: int) -> Cache:
        if isinstance(stores[0], LinearStore):
            return {n: torch.stack([s.state[n] for s in stores if isinstance(s, LinearStore)])
                    for n in ("state", "conv")}
        out: Cache = {}
        for s in stores:
            assert isinstance(s, AttnStore) and s.first_token == 0
        rows = [s.gather(0, self.pos) for s in stores if isinstance(s, AttnStore)]
        for name, t in rows[0].items():
            out[name] = torch.zeros(len(stores), cap, *t.shape[1:], dtype=t.dtype,
                                    device=t.device)
            out[name][:, :self.pos] = torch.stack([r[name] for r in rows])
        return out

    @torch.inference_mode()
    def step(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B] at position self.pos -> logits [B, vocab]."""
        x = self.model.embed[token_ids]
        for i in range(len(self.model.blocks)):
            block = self.model.block(i)
            h = rms_norm(x, block.norm1)
            x = block._mlp(x + self._mix(block.mixer, h, self.caches[i]))
        self.pos += 1
        return self.model.logits(x)

    def _mix(self, mixer: MLA | GQA | KDA, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        if isinstance(mixer, KDA):
            return _kda(mixer, x, cache)
        positions = torch.full((x.shape[0],), self.pos, dtype=torch.long, device=x.device)
        if isinstance(mixer, MLA):
            return _mla(mixer, x, cache, positions)
        return _gqa(mixer, x, cache, positions)


def _kda(m: KDA, x: torch.Tensor, cache: Cache) -> torch.Tensor:
    window = torch.cat((cache["conv"], proj(x, m.w_qkv)[:, None]), dim=1)
    q, k, v = m._qkv(_conv(window, m.conv_w, 1)[:, 0])
    beta, g = m._gates(x)
    o, cache["state"] = kda_recurrent_step(q, k, v, g, beta, cache["state"])
    cache["conv"] = window[:, 1:]
    return m._out(x, o)


def _mla(m: MLA, x: torch.Tensor, cache: Cache, positions: torch.Tensor) -> torch.Tensor:
    b, p = x.shape[0], int(positions[0])
    q, latent, k_rope = m._qkv_latent(x, positions)
    cache["latent"][:, p], cache["k_rope"][:, p] = latent, k_rope
    lat, kr = cache["latent"][:, :p + 1], cache["k_rope"][:, :p + 1]
    q_lat = torch.einsum("bhd,hdr->bhr", q[..., :m.dn], m.w_uk.view(m.h, m.dn, m.r))
    scores = torch.einsum("bhr,bnr->bhn", q_lat, lat) + torch.einsum(
        "bhd,bnd->bhn", q[..., m.dn:], kr)
    probs = torch.softmax(scores * (m.dn + m.dr) ** -0.5, dim=-1)
    ctx = torch.einsum("bhn,bnr->bhr", probs, lat)
    o = torch.einsum("bhr,hdr->bhd", ctx, m.w_uv.view(m.h, m.dn, m.r))
    return proj(o.reshape(b, m.h * m.dn), m.wo)


def _gqa(m: GQA, x: torch.Tensor, cache: Cache, positions: torch.Tensor) -> torch.Tensor:
    b, p = x.shape[0], int(positions[0])
    q, k, v = m._qkv(x, positions)
    cache["k"][:, p], cache["v"][:, p] = k, v
    lo = max(0, p - m.window + 1) if m.window else 0
    rep = m.h // m.kvh
    keys = cache["k"][:, lo:p + 1].repeat_interleave(rep, dim=2)  # [B, N, H, d]
    vals = cache["v"][:, lo:p + 1].repeat_interleave(rep, dim=2)
    scores = torch.einsum("bhd,bnhd->bhn", q, keys) * m.d ** -0.5
    o = torch.einsum("bhn,bnhd->bhd", torch.softmax(scores, dim=-1), vals)
    return proj(o.reshape(b, m.h * m.d), m.wo)
