"""KDA-style linear attention: the gated delta rule with channel-wise forget gates.

Per head, with state S [dk, dv], gate a_t in (0, 1]^dk, strength b_t in (0, 1):
    S_t = (I - b_t k_t k_t^T) diag(a_t) S_{t-1} + b_t k_t v_t^T,      o_t = S_t^T q_t
`kda_recurrent_step` is that formula (decode). `kda_chunk` is the chunkwise-parallel form
(prefill): with g_t = log a_t and B_t = cumsum(g) inside a chunk, the delta-rule updates U
solve (I + A) U = beta * (V - (K e^B) S_0), A strictly lower triangular with
A_ts = b_t (k_t e^B_t).(k_s e^-B_s).
The gate is floored at GATE_FLOOR per token so e^{+-B} stays within fp32 over a 64-token
chunk (Kimi Linear likewise bounds its gate for the same reason).
"""

from __future__ import annotations

import torch

GATE_FLOOR = -1.0  # min log a_t; 64 tokens * 1.0 = 64 < 87 (fp32 exp range)


def kda_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              beta: torch.Tensor, state: torch.Tensor, chunk: int = 64,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [H, T, dk], v [H, T, dv], g (log gate) [H, T, dk], beta [H, T], state [H, dk, dv]
    -> (o [H, T, dv], final state). T is split into sub-chunks of `chunk` tokens."""
    outputs = []
    for lo in range(0, q.shape[1], chunk):
        hi = min(lo + chunk, q.shape[1])
        o, state = _one_chunk(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi],
                              beta[:, lo:hi], state)
        outputs.append(o)
    return torch.cat(outputs, dim=1), state


def _one_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, s0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = q.shape[1]
    b = torch.cumsum(g, dim=1)  # [H, C, dk], decreasing, >= GATE_FLOOR * C
    decay, grow = torch.exp(b), torch.exp(-b)
    kd, ki, qd = k * decay, k * grow, q * decay
    strictly_lower = torch.ones(c, c, dtype=torch.bool).tril(-1)
    a = torch.matmul(kd, ki.transpose(-1, -2)) * beta[..., None]  # [H, C, C]
    a = a.masked_fill(~strictly_lower, 0.0) + torch.eye(c)
    rhs = beta[..., None] * (v - torch.matmul(kd, s0))  # [H, C, dv]
    u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    scores = torch.matmul(qd, ki.transpose(-1, -2))  # [H, C, C]
    scores = scores.masked_fill(~torch.ones(c, c, dtype=torch.bool).tril(), 0.0)
    o = torch.matmul(qd, s0) + torch.matmul(scores, u)
    b_end = b[:, -1:, :]  # [H, 1, dk]
    k_to_end = k * torch.exp(b_end - b)  # <= |k|: no overflow
    s_end = torch.exp(b_end).transpose(-1, -2) * s0 + torch.matmul(k_to_end.transpose(-1, -2), u)
    return o, s_end


def kda_recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, state: torch.Tensor,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k, g [B, H, dk], v [B, H, dv], beta [B, H],
    state [B, H, dk, dv] -> (o [B, H, dv], new state). Elementwise products and sums, not
    batched GEMMs, so each row's result does not depend on the batch it is in."""
    s = state * torch.exp(g)[..., None]
    ks = (s * k[..., None]).sum(dim=-2)  # [B, H, dv]
    u = beta[..., None] * (v - ks)
    s = s + k[..., None] * u[..., None, :]
    o = (s * q[..., None]).sum(dim=-2)
    return o, s


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form over a whole sequence ([H, T, ...] like kda_chunk), for tests."""
    outputs = []
    s = state[None]
    for t in range(q.shape[1]):
        o, s = kda_recurrent_step(q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t],
                                  beta[None, :, t], s)
        outputs.append(o[0])
    return torch.stack(outputs, dim=1), s[0]
