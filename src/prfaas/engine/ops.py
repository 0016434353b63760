"""Numerical building blocks shared by every layer kind, written for bitwise reproducibility.

`proj` pads the row count to at least MIN_GEMM_ROWS: with one intra-op thread MKL computes each
output row of a GEMM with M >= 8 identically whatever M is, while M < 8 takes a different kernel.
Padding makes a request's decode row bitwise the same alone or in a batch of 32. Everything else
here is row-wise (norms, rope, elementwise), so it is batch-invariant by construction.
Every tensor made here is made on its inputs' device and in their dtype (a GPU engine).

`causal_attention` is explicit matmul + softmax (its kernels cannot change with the shapes'
history: the CPU engine's bitwise contract); `fused_causal_attention` is PyTorch's
scaled_dot_product_attention with a lower-right causal bias, which on a GPU runs a
flash / memory-efficient kernel that never materialises the [heads, chunk, context] scores
(at 128K tokens of context an 8K chunk's scores would take 137 GB in fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_GEMM_ROWS = 8
NEG_INF = float("-inf")


def proj(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, in] @ weight[out, in]^T -> [M, out], rows computed independently of M."""
    rows = x.shape[0]
    if rows >= MIN_GEMM_ROWS:
        return F.linear(x, weight)
    padded = torch.zeros(MIN_GEMM_ROWS, x.shape[1], dtype=x.dtype, device=x.device)
    padded[:rows] = x
    return F.linear(padded, weight)[:rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def rope_tables(max_tokens: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_tokens, dim/2] (computed in float64 then cast, so they are exact
    functions of the position and identical in every process)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(max_tokens, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, ..., d] with cos/sin [T, d/2] (already gathered at the tokens' positions)."""
    half = x.shape[-1] // 2
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                     k_start: int, window: int = 0, q_repeat: int = 1) -> torch.Tensor:
    """q [H, R*C, d] at positions q_start.. (R = q_repeat query groups of C rows each, for GQA
    heads sharing one kv head), k/v [H, N, d] at k_start.. -> [H, R*C, dv].

    Query p sees keys j with j <= p (and j > p - window when window > 0). Explicit matmul and
    softmax rather than SDPA, so the kernel choice cannot change with the shapes' history.
    """
    scale = q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [H, R*C, N]
    q_pos = torch.arange(q_start, q_start + q.shape[1] // q_repeat,
                         device=q.device).repeat(q_repeat)[:, None]
    k_pos = torch.arange(k_start, k_start + k.shape[1], device=q.device)[None, :]
    allowed = k_pos <= q_pos
    if window > 0:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed, NEG_INF)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def fused_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           ) -> torch.Tensor:
    """`causal_attention` where the queries are the LAST q.shape[1] positions of the keys
    (q [H, C, d] at positions N-C..N-1, k [H, N, d], v [H, N, dv] from position 0 of the
    window): scaled_dot_product_attention with a lower-right causal bias, scale d^-0.5 as
    there. A value head narrower than the key head is zero-padded to it and the output cut
    back, so the flash kernel (equal head sizes) applies too. The same math as
    causal_attention, not the same bits: for GPUs, where no bitwise contract holds."""
    from torch.nn.attention.bias import causal_lower_right

    dv = v.shape[-1]
    if dv < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - dv))
    bias = causal_lower_right(q.shape[-2], k.shape[-2])
    # [1, H, L, d]: the fused kernels take 4-D inputs only (3-D falls back to the reference
    # kernel, which materialises the mask and the scores)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=bias)[0]
    return out[..., :dv]


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
           w_down: torch.Tensor) -> torch.Tensor:
    return proj(F.silu(proj(x, w_gate)) * proj(x, w_up), w_down)
