"""Full-attention cache blocks in the link's wire dtype (fp8) for PrfaasConnector (no vLLM).

transport/quant.py encodes a float32 array [T, *heads, D] (T tokens) with one fp32 scale per 16
tokens per head; the native path hands it token-major tensors. A vLLM attention layer's blocks
are not token-major, so `BlockLayout` moves gathered blocks to and from [n*N, H, 2, D] (n blocks
of N tokens; per KV head its key and its value vector, each with its own scales, as the native
engine's K and V tensors), for the two paged layouts prfaas meets:
- CPU backend, blocks on dim 0: [n, H, N, 2D]: per block and head a page of N*2D values whose
  order is the backend's own (vLLM's cpu_attn splits the page into a key and a value half; its
  vector kernels store the keys dim-major, [D, N], and the values token-major, [N, D]). The page
  order comes from the backend itself (cpu_layout.py writes known keys and values through it
  and reads where they land); without it, both halves are taken as token-major;
- FlashAttention-style, blocks on dim 1: [2, n, N, H, D].
Any other shape is a TransportError when fp8 is asked for (bf16 travels as whole blocks, layout
unseen). The receiver dequantizes into its cache dtype. Rows past the prompt's end (the tail of
its last block: stale values of an earlier request) are zeroed before the scales are taken, so
they cannot widen the step of the prompt's last tokens. GDN conv/recurrent states never come here:
they keep their dtype (docs/wire-format.md, "What keeps its dtype").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from prfaas.core.errors import TransportError
from prfaas.integrations.vllm.params import FP8
from prfaas.models.kv import WIRE_SCALE_BLOCK_TOKENS
from prfaas.transport.quant import (
    SCALE_SUFFIX,
    coarse_int4_per_tensor,
    decode_arrays,
    encode_arrays,
)


@dataclass(frozen=True, slots=True)
class BlockLayout:
    num_kv_heads: int
    block_size: int  # tokens per block
    head_size: int
    # CPU layout: where token t's key (kv=0) or value (kv=1) element d sits in a head's page
    # of N*2D values, int64 [N, 2, D]; None: the key half then the value half, each [N, D]
    page_order: np.ndarray | None = field(default=None, compare=False)

    @classmethod
    def of(cls, spec: Any) -> BlockLayout:
        """From a vLLM attention KV cache spec (num_kv_heads, block_size, head_size)."""
        v = getattr(spec, "head_size_v", None)
        if v not in (None, spec.head_size):
            raise TransportError(f"fp8 wire: key head size {spec.head_size} != value head "
                                 f"size {v} is not a layout the connector quantizes")
        return cls(int(spec.num_kv_heads), int(spec.block_size), int(spec.head_size))

    def with_page_order(self, order: np.ndarray) -> BlockLayout:
        """This layout with a CPU page order read from the backend; a TransportError unless
        `order` places every (token, key|value, dim) at its own place in the page."""
        n, d = self.block_size, self.head_size
        if order.shape != (n, 2, d) or not np.array_equal(np.sort(order, axis=None),
                                                          np.arange(n * 2 * d)):
            raise TransportError(f"fp8 wire: the backend's page order {order.shape} is not a "
                                 f"permutation of [{n}, 2, {d}]")
        return replace(self, page_order=order)

    def _order(self) -> torch.Tensor:
        """The page order, flat in (token, key|value, dim) order."""
        n, d = self.block_size, self.head_size
        if self.page_order is None:
            kv, tok, dim = np.meshgrid(np.arange(2), np.arange(n), np.arange(d), indexing="ij")
            return torch.from_numpy((kv * n * d + tok * d + dim).transpose(1, 0, 2).reshape(-1))
        return torch.from_numpy(np.ascontiguousarray(self.page_order).reshape(-1))

    def check(self, blocks: torch.Tensor, dim: int) -> int:
        """The number of blocks; a TransportError for a layout this does not know."""
        h, n, d = self.num_kv_heads, self.block_size, self.head_size
        cpu = dim == 0 and tuple(blocks.shape[1:]) == (h, n, 2 * d)
        flash = dim == 1 and blocks.shape[0] == 2 and tuple(blocks.shape[2:]) == (n, h, d)
        if not (cpu or flash):
            raise TransportError(f"fp8 wire: cache blocks {tuple(blocks.shape)} (blocks on dim "
                                 f"{dim}) are neither [n, {h}, {n}, {2 * d}] nor "
                                 f"[2, n, {n}, {h}, {d}]")
        return int(blocks.shape[dim])

    def codes(self, num_blocks: int) -> int:
        """fp8 codes of `num_blocks` blocks (one byte each): [n*N, H, 2, D]."""
        return num_blocks * self.block_size * self.num_kv_heads * 2 * self.head_size

    def wire_nbytes(self, num_blocks: int) -> int:
        """Bytes of `num_blocks` blocks in fp8 on the wire: the codes and their float32 scales
        [ceil(n*N / 16), H, 2] (transport/quant.py)."""
        rows = num_blocks * self.block_size
        scales = -(-rows // WIRE_SCALE_BLOCK_TOKENS) * self.num_kv_heads * 2
        return self.codes(num_blocks) + 4 * scales

    def token_major(self, blocks: torch.Tensor, dim: int) -> np.ndarray:
        """Gathered blocks -> float32 [n*N, H, 2, D]."""
        nb = self.check(blocks, dim)
        h, n, d = self.num_kv_heads, self.block_size, self.head_size
        x = blocks.detach().to("cpu", torch.float32)
        if dim == 0:  # each head's page in (token, key|value, dim) order -> [nb, N, H, 2, D]
            x = x.reshape(nb, h, n * 2 * d)[:, :, self._order()]
            x = x.reshape(nb, h, n, 2, d).permute(0, 2, 1, 3, 4)
        else:
            x = x.permute(1, 2, 3, 0, 4)  # [2, nb, N, H, D] -> [nb, N, H, 2, D]
        out: np.ndarray = x.reshape(nb * n, h, 2, d).contiguous().numpy()
        return out

    def from_token_major(self, rows: np.ndarray, dim: int, dtype: torch.dtype) -> torch.Tensor:
        """float32 [n*N, H, 2, D] -> blocks in the cache's layout and dtype."""
        h, n, d = self.num_kv_heads, self.block_size, self.head_size
        if rows.ndim != 4 or rows.shape[1:] != (h, 2, d) or rows.shape[0] % n:
            raise TransportError(f"fp8 wire: rows {rows.shape} are not whole blocks of "
                                 f"[{n}, {h}, 2, {d}]")
        nb = rows.shape[0] // n
        x = torch.from_numpy(np.ascontiguousarray(rows)).reshape(nb, n, h, 2, d)
        if dim == 0:  # [nb, H, N, 2, D] in (token, key|value, dim) order -> each head's page
            flat = x.permute(0, 2, 1, 3, 4).reshape(nb, h, n * 2 * d)
            page = torch.empty_like(flat)
            page[:, :, self._order()] = flat
            x = page.reshape(nb, h, n, 2 * d)
        else:
            x = x.permute(3, 0, 1, 2, 4)  # [2, nb, N, H, D]
        return x.to(dtype).contiguous()


def encode_blocks(blocks: torch.Tensor, dim: int, layout: BlockLayout, valid_tokens: int,
                  name: str) -> list[tuple[str, np.ndarray]]:
    """(name, uint8 codes [n*N, H, 2, D]) and (name.scale, float32 [n*N/16, H, 2]): gathered
    blocks in fp8 (transport/quant.py); rows from `valid_tokens` on are zeroed first."""
    rows = layout.token_major(blocks, dim)
    rows[max(valid_tokens, 0):] = 0
    return encode_arrays([(name, rows)], FP8)


def decode_blocks(arrived: dict[str, np.ndarray], name: str, layout: BlockLayout, dim: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """The blocks `name` (codes and `name.scale` in `arrived`) in the cache's layout and dtype."""
    if set(arrived) != {name, name + SCALE_SUFFIX}:
        raise TransportError(f"fp8 wire: {sorted(arrived)} is not {name!r} and its scale")
    return layout.from_token_major(decode_arrays(arrived)[name], dim, dtype)


def int4_control(blocks: torch.Tensor, dim: int, layout: BlockLayout) -> torch.Tensor:
    """Negative control (tests, benchmarks): the blocks through 4-bit integers with one scale
    for the whole tensor (transport/quant.py), a deliberately coarser quantizer than fp8's."""
    rows = coarse_int4_per_tensor(layout.token_major(blocks, dim))
    return layout.from_token_major(rows, dim, blocks.dtype)
