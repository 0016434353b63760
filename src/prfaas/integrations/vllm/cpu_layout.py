"""Where vLLM's CPU attention backend keeps each token's key and value inside a cache block.

The backend's page per block and KV head holds N*2D values (N tokens, head size D), split into
a key half and a value half; how each half is ordered is the kernel's business and differs by
instruction set (the vector kernels store keys dim-major, [D, N], so a dot product reads one
dimension of N keys at once, and values token-major). fp8 on the wire quantizes per token, so
the connector must know that order: this module asks the backend itself, writing a block of
known keys and values through its own `cpu_attn_reshape_and_cache` (the op every CPU attention
layer writes its cache with) and reading where each one landed.
"""

from __future__ import annotations

import numpy as np
import torch

from prfaas.core.errors import TransportError
from prfaas.integrations.vllm.wire_quant import BlockLayout

_DIGIT = 64  # ids are written as two base-64 digits, each 1..64: exact in bf16 and fp16


def cpu_page_order(layout: BlockLayout, dtype: torch.dtype) -> np.ndarray:
    """int64 [N, 2, D]: the position in a head's page of token t's key (0) or value (1)
    element d, as vLLM's CPU backend writes a block of `layout` in `dtype`."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    h, n, d = layout.num_kv_heads, layout.block_size, layout.head_size
    if max(n, d) > _DIGIT * _DIGIT:
        raise TransportError(f"fp8 wire: block size {n} or head size {d} too large to read "
                             "the CPU cache layout")
    isa = _get_attn_isa(dtype, n, d)
    page = torch.zeros(1, h, n, 2 * d, dtype=dtype)
    key_half, value_half = page.view(1, h, 2 * n, d).chunk(2, dim=2)

    def landed(ids: torch.Tensor) -> np.ndarray:
        """Write keys `ids` and values `-ids` ([N, D], values 1..64) to every head; head 0's
        page as it was written."""
        page.zero_()
        kv = ids[:, None, :].expand(n, h, d).to(dtype).contiguous()
        try:
            ops.cpu_attn_reshape_and_cache(kv, (-kv).contiguous(), key_half, value_half,
                                           torch.arange(n, dtype=torch.int64), isa)
        except RuntimeError as exc:  # NotImplementedError included
            raise TransportError(f"fp8 wire: vLLM's CPU attention ({isa}) cannot write a "
                                 f"[{n} tokens, {h} heads, {d}] block: {exc}") from exc
        out: np.ndarray = page[0, 0].reshape(-1).float().numpy()
        if not out.all():
            raise TransportError(f"fp8 wire: vLLM's CPU attention ({isa}) left part of a "
                                 f"[{n}, 2, {d}] page unwritten")
        return out

    def read(index: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Per page place: the id (token or dim) written there, and whether it is a value."""
        lo, hi = landed(index % _DIGIT + 1.0), landed(index // _DIGIT + 1.0)
        ids = (np.abs(hi).astype(np.int64) - 1) * _DIGIT + np.abs(lo).astype(np.int64) - 1
        return ids, lo < 0

    token, is_value = read(torch.arange(n, dtype=torch.float32)[:, None].expand(n, d))
    dim, _ = read(torch.arange(d, dtype=torch.float32)[None, :].expand(n, d))
    order = np.full((n, 2, d), -1, dtype=np.int64)
    order[token, is_value.astype(np.int64), dim] = np.arange(n * 2 * d)
    return order


def with_cpu_page_order(layout: BlockLayout, dtype: torch.dtype) -> BlockLayout:
    """`layout` with the page order the CPU backend writes (a TransportError if it cannot be
    read or is not one place per value)."""
    return layout.with_page_order(cpu_page_order(layout, dtype))
