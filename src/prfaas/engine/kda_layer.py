"""The KDA mixer (Kimi-Delta-Attention-like linear layer), same entry points as attention.py.

x -> q, k, v projections -> short causal depthwise conv (kernel 4) + SiLU -> L2-normalised
q, k per head; beta = sigmoid(W_b x); channel-wise forget gate
log a = max(-exp(A_log) * softplus(W_gb W_ga x + dt_bias), GATE_FLOOR); gated delta rule
(kda.py); per-head RMSNorm of the output times a sigmoid output gate; output projection.
The layer's cache is fixed-size: the delta-rule state [H, dk, dv] and the conv state
[kernel-1, 3*H*dk] (the last kernel-1 pre-conv inputs). On a bf16 engine the projections and the
conv state are bf16 and the gated delta rule runs in float32 with a float32 state (as Kimi
Linear's kernels and vLLM's KDA state do); on the fp32 CPU engine every cast is a no-op.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prfaas.engine.kda import GATE_FLOOR, kda_chunk, kda_recurrent_step
from prfaas.engine.kv import LinearStore, Store
from prfaas.engine.ops import l2_norm, proj, rms_norm
from prfaas.models.engine_config import CONV_KERNEL, EngineConfig


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape), requires_grad=False)


def _conv(window: torch.Tensor, weight: torch.Tensor, out_len: int) -> torch.Tensor:
    """Depthwise causal conv as a fixed-order sum (no conv kernel whose reduction order could
    depend on the shape): window [..., out_len + K - 1, CH] -> [..., out_len, CH]."""
    out = window[..., 0:out_len, :] * weight[0]
    for j in range(1, weight.shape[0]):
        out = out + window[..., j:j + out_len, :] * weight[j]
    return F.silu(out)


class KDA(nn.Module):
    kind = "linear"

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.h, self.dk = cfg.num_heads, cfg.head_dim
        self.channels = cfg.conv_channels
        self.snapshot_every_tokens = cfg.block_size_tokens * cfg.snapshot_every_blocks
        self.chunk = cfg.kda_chunk_tokens
        self.w_qkv = _param(self.channels, cfg.hidden)
        self.conv_w = _param(CONV_KERNEL, self.channels)
        self.w_beta = _param(self.h, cfg.hidden)
        self.w_ga = _param(cfg.gate_rank, cfg.hidden)
        self.w_gb = _param(self.h * self.dk, cfg.gate_rank)
        self.a_log = _param(self.h)
        self.dt_bias = _param(self.h * self.dk)
        self.w_og = _param(self.h * self.dk, cfg.hidden)
        self.o_norm = _param(self.dk)
        self.wo = _param(cfg.hidden, self.h * self.dk)

    def new_store(self) -> LinearStore:
        where = self.w_qkv.device
        state = {"state": torch.zeros(self.h, self.dk, self.dk, device=where),
                 "conv": torch.zeros(CONV_KERNEL - 1, self.channels, dtype=self.w_qkv.dtype,
                                     device=where)}
        return LinearStore(state, 0, self.snapshot_every_tokens)

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """beta [N, H] and log forget gate [N, H, dk]."""
        n = x.shape[0]
        beta = torch.sigmoid(proj(x, self.w_beta))
        raw = proj(proj(x, self.w_ga), self.w_gb) + self.dt_bias
        g = -torch.exp(self.a_log)[:, None] * F.softplus(raw).view(n, self.h, self.dk)
        return beta, g.clamp(min=GATE_FLOOR)

    def _qkv(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[N, 3*H*dk] -> q (scaled), k (unit norm), v, each [N, H, dk]."""
        q, k, v = conv_out.view(conv_out.shape[0], 3, self.h, self.dk).unbind(1)
        return l2_norm(q) * self.dk ** -0.5, l2_norm(k), v

    def _out(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        gate = torch.sigmoid(proj(x, self.w_og)).view(n, self.h, self.dk)
        return proj((rms_norm(o, self.o_norm) * gate).reshape(n, self.h * self.dk), self.wo)

    def _sequence(self, x: torch.Tensor, state: dict[str, torch.Tensor],
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Chunkwise-parallel form over x [T, D] from `state`."""
        t = x.shape[0]
        window = torch.cat((state["conv"], proj(x, self.w_qkv)))  # [T + K - 1, CH]
        q, k, v = self._qkv(_conv(window, self.conv_w, t))
        beta, g = self._gates(x)
        qh, kh, vh, gh = (a.transpose(0, 1).float() for a in (q, k, v, g))
        o, s = kda_chunk(qh, kh, vh, gh, beta.T.float(), state["state"], self.chunk)
        new_state = {"state": s, "conv": window[-(CONV_KERNEL - 1):].clone()}
        return self._out(x, o.transpose(0, 1).to(x.dtype)), new_state

    def prefill_chunk(self, x: torch.Tensor, start: int, store: Store, work: dict[str, Any],
                      ) -> torch.Tensor:
        assert isinstance(store, LinearStore) and store.num_tokens == start
        y, state = self._sequence(x, store.state)
        store.advance(state, start + x.shape[0])
        return y

    def decode(self, x: torch.Tensor, stores: list[Store], positions: torch.Tensor,
               ) -> torch.Tensor:
        linear = [s for s in stores if isinstance(s, LinearStore)]
        conv = torch.stack([s.state["conv"] for s in linear])  # [B, K-1, CH]
        window = torch.cat((conv, proj(x, self.w_qkv)[:, None]), dim=1)  # [B, K, CH]
        q, k, v = self._qkv(_conv(window, self.conv_w, 1)[:, 0])
        beta, g = self._gates(x)
        s0 = torch.stack([s.state["state"] for s in linear])
        o, s1 = kda_recurrent_step(q.float(), k.float(), v.float(), g.float(), beta.float(), s0)
        o = o.to(x.dtype)
        for i, store in enumerate(linear):
            store.advance({"state": s1[i], "conv": window[i, 1:]}, store.num_tokens + 1)
        return self._out(x, o)

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        return self._sequence(x, self.new_store().state)[0]
