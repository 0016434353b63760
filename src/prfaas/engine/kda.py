"""KDA-style linear attention: the gated delta rule with channel-wise forget gates.

Per head, with state S [dk, dv], gate a_t in (0, 1]^dk, strength b_t in (0, 1):
    S_t = (I - b_t k_t k_t^T) diag(a_t) S_{t-1} + b_t k_t v_t^T,      o_t = S_t^T q_t
`kda_recurrent_step` is that formula (decode). `kda_chunk` is the chunkwise-parallel form
(prefill): with g_t = log a_t and B_t = cumsum(g) inside a chunk, the delta-rule updates U
solve (I + A) U = beta * (V - (K e^B) S_0), A strictly lower triangular with
A_ts = b_t (k_t e^B_t).(k_s e^-B_s).
The gate is floored at GATE_FLOOR per token so e^{+-B} stays within fp32 over a 64-token
chunk (Kimi Linear likewise bounds its gate for the same reason).

Over more than one chunk (`kda_chunk` with T > chunk) the chunks' own work is done for all of
them at once, and only the state is carried chunk to chunk. Solving for both right-hand sides,
U = U0 - W S with U0 = A^-1 beta V and W = A^-1 beta K e^B, the state after chunk n is linear
in the state before it: S_{n+1} = M_n S_n + B_n, M_n = diag(e^{B_end}) - (K e^{B_end - B})^T W,
B_n = (K e^{B_end - B})^T U0. So the sequential part is ONE batched matmul-add per chunk
(`baddbmm`) instead of the ~20 operations of a chunk's whole step, and everything else is a
fixed number of batched operations however long the input: on a GPU the KDA prefill's
kernel launches per 64 tokens fall from ~80 to ~1.7 at 8192-token prefill chunks
(benchmarks/bench_kda_launches.py). A single chunk keeps the direct form (`_one_chunk`): the
CPU engine prefills one 64-token block at a time, and its bits are what its exactness tests pin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GATE_FLOOR = -1.0  # min log a_t; 64 tokens * 1.0 = 64 < 87 (fp32 exp range)


def kda_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              beta: torch.Tensor, state: torch.Tensor, chunk: int = 64,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [H, T, dk], v [H, T, dv], g (log gate) [H, T, dk], beta [H, T], state [H, dk, dv]
    -> (o [H, T, dv], final state). T is split into sub-chunks of `chunk` tokens: one is
    computed directly, several together (module doc)."""
    if q.shape[1] <= chunk:
        return _one_chunk(q, k, v, g, beta, state)
    return _chunks(q, k, v, g, beta, state, chunk)


def kda_chunk_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, state: torch.Tensor, chunk: int = 64,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """`kda_chunk` as one direct step per sub-chunk: the reference the batched form is tested
    against, and the launch count it is measured against."""
    outputs = []
    for lo in range(0, q.shape[1], chunk):
        hi = min(lo + chunk, q.shape[1])
        o, state = _one_chunk(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi],
                              beta[:, lo:hi], state)
        outputs.append(o)
    return torch.cat(outputs, dim=1), state


def _chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
            beta: torch.Tensor, s0: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Several sub-chunks: their own work batched, the state carried by one baddbmm each.
    The input is zero-padded to whole chunks: a padded token has k = v = beta = 0 and gate 1
    (g = 0), so it neither writes the state nor decays it."""
    h, t, dk = q.shape
    dv = v.shape[-1]
    n = -(-t // c)
    pad = n * c - t
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    q, k, g = (x.reshape(h, n, c, dk) for x in (q, k, g))
    v, beta = v.reshape(h, n, c, dv), beta.reshape(h, n, c)
    b = torch.cumsum(g, dim=2)  # [H, N, C, dk]
    kd, ki, qd = k * torch.exp(b), k * torch.exp(-b), q * torch.exp(b)
    ones = torch.ones(c, c, dtype=torch.bool, device=q.device)
    a = torch.matmul(kd, ki.transpose(-1, -2)) * beta[..., None]  # [H, N, C, C]
    a = a.masked_fill(~ones.tril(-1), 0.0) + torch.eye(c, dtype=a.dtype, device=a.device)
    rhs = beta[..., None] * torch.cat((v, kd), dim=-1)  # [H, N, C, dv + dk]
    sol = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u0, w = sol[..., :dv], sol[..., dv:]  # a chunk's U = u0 - w @ (its start state)
    scores = torch.matmul(qd, ki.transpose(-1, -2)).masked_fill(~ones.tril(), 0.0)
    b_end = b[:, :, -1:, :]  # [H, N, 1, dk]
    k_end = (k * torch.exp(b_end - b)).transpose(-1, -2)  # [H, N, dk, C], <= |k|
    m = torch.diag_embed(torch.exp(b_end[:, :, 0])) - torch.matmul(k_end, w)  # [H, N, dk, dk]
    m = m.transpose(0, 1).contiguous()  # chunk-major: m[i] is one contiguous [H, dk, dk]
    states = torch.empty(n + 1, h, dk, dv, dtype=s0.dtype, device=s0.device)
    states[0] = s0
    states[1:] = torch.matmul(k_end, u0).transpose(0, 1)  # B_i, then M_i S_i added in place
    for i in range(n):  # the only sequential part: S_{i+1} = M_i S_i + B_i, one GEMM
        states[i + 1].baddbmm_(m[i], states[i])
    starts = states[:n].transpose(0, 1)  # [H, N, dk, dv]: each chunk's start state
    u = u0 - torch.matmul(w, starts)
    o = torch.matmul(qd, starts) + torch.matmul(scores, u)  # [H, N, C, dv]
    return o.reshape(h, n * c, dv)[:, :t], states[n]


def _one_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, s0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = q.shape[1]
    b = torch.cumsum(g, dim=1)  # [H, C, dk], decreasing, >= GATE_FLOOR * C
    decay, grow = torch.exp(b), torch.exp(-b)
    kd, ki, qd = k * decay, k * grow, q * decay
    strictly_lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
    a = torch.matmul(kd, ki.transpose(-1, -2)) * beta[..., None]  # [H, C, C]
    a = a.masked_fill(~strictly_lower, 0.0) + torch.eye(c, dtype=a.dtype, device=a.device)
    rhs = beta[..., None] * (v - torch.matmul(kd, s0))  # [H, C, dv]
    u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    scores = torch.matmul(qd, ki.transpose(-1, -2))  # [H, C, C]
    scores = scores.masked_fill(~torch.ones(c, c, dtype=torch.bool, device=q.device).tril(), 0.0)
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
