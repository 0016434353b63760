"""The KDA chunkwise-parallel form (prefill) against the recurrent form (decode).

Tolerance: both are fp32 but associate sums differently (a triangular solve and matmuls
against a token-by-token loop), so they agree to a few ulps of the values (|o| ~ 0.1-1),
not bitwise; 2e-5 absolute is ~100x the observed gap and far below any real discrepancy.
"""

from __future__ import annotations

import pytest
import torch

from prfaas.engine.kda import GATE_FLOOR, kda_chunk, kda_recurrent
from prfaas.engine.ops import l2_norm


def _inputs(t: int, seed: int, gate_scale: float) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    h, dk, dv = 3, 16, 8
    q = l2_norm(torch.randn(h, t, dk, generator=gen)) * dk ** -0.5
    k = l2_norm(torch.randn(h, t, dk, generator=gen))
    v = torch.randn(h, t, dv, generator=gen)
    g = (-torch.rand(h, t, dk, generator=gen) * gate_scale).clamp(min=GATE_FLOOR)
    beta = torch.rand(h, t, generator=gen)
    s0 = torch.randn(h, dk, dv, generator=gen) * 0.3
    return q, k, v, g, beta, s0


@pytest.mark.parametrize(("t", "chunk", "gate_scale"), [
    (1, 64, 0.5), (63, 64, 0.5), (64, 64, 0.5), (150, 64, 0.1), (150, 16, 2.0), (130, 64, 5.0),
])
def test_chunk_form_matches_recurrent_form(t: int, chunk: int, gate_scale: float) -> None:
    q, k, v, g, beta, s0 = _inputs(t, seed=t + chunk, gate_scale=gate_scale)
    o_chunk, s_chunk = kda_chunk(q, k, v, g, beta, s0, chunk)
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, s0)
    assert o_chunk.shape == o_rec.shape == (3, t, 8)
    torch.testing.assert_close(o_chunk, o_rec, atol=2e-5, rtol=0)
    torch.testing.assert_close(s_chunk, s_rec, atol=2e-5, rtol=0)


def test_gate_floor_keeps_chunk_form_finite() -> None:
    """Every gate at the floor: e^{+-cumsum} spans e^{+-64} over a chunk, still inside fp32."""
    q, k, v, _, beta, s0 = _inputs(128, seed=7, gate_scale=1.0)
    g = torch.full_like(q, GATE_FLOOR)
    o, s = kda_chunk(q, k, v, g, beta, s0, 64)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, kda_recurrent(q, k, v, g, beta, s0)[0], atol=2e-5, rtol=0)


def test_state_carries_information_across_chunks() -> None:
    """A different initial state changes later outputs (the state is really used)."""
    q, k, v, g, beta, s0 = _inputs(70, seed=3, gate_scale=0.05)
    o1, _ = kda_chunk(q, k, v, g, beta, s0, 64)
    o2, _ = kda_chunk(q, k, v, g, beta, torch.zeros_like(s0), 64)
    assert (o1[:, -1] - o2[:, -1]).abs().max() > 1e-4
