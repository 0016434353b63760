"""Moving whole cache blocks between vLLM's paged tensors and wire arrays (torch, no vLLM).

A layer's cache is one tensor whose block axis is found by its size (`num_blocks`): dim 0 on
the CPU backend (`[blocks, kv_heads, block_size, 2*head]`), dim 1 for FlashAttention-style
`[2, blocks, ...]`. A Mamba/GDN layer's cache is one raw page tensor or a list of state tensors
(conv, ssm), each with blocks on dim 0. Copying whole blocks keeps this independent of the
layout inside a block: both ends run the same model with the same cache config.
"""

from __future__ import annotations

import numpy as np
import torch

from prfaas.core.errors import TransportError


def block_dim(t: torch.Tensor, num_blocks: int) -> int:
    for d in (0, 1):
        if t.dim() > d and t.shape[d] == num_blocks:
            return d
    raise TransportError(f"no block axis of size {num_blocks} in cache shape {tuple(t.shape)}")


def to_wire(t: torch.Tensor) -> tuple[np.ndarray, bool]:
    """A contiguous CPU tensor as a numpy array; bf16 as uint16 words (flag True)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    if t.element_size() == 1:
        return t.view(torch.uint8).numpy(), False
    return t.numpy(), False


def from_wire(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The wire array as a tensor of `like`'s dtype (same element size, reinterpreted)."""
    src = torch.from_numpy(np.ascontiguousarray(array))
    if src.element_size() != like.element_size():
        raise TransportError(f"element size {src.element_size()} B on the wire, "
                             f"{like.element_size()} B in the cache ({like.dtype})")
    return src.view(like.dtype)


def gather(cache: torch.Tensor, ids: list[int], dim: int) -> torch.Tensor:
    return cache.index_select(dim, torch.tensor(ids, dtype=torch.long, device=cache.device))


def scatter(cache: torch.Tensor, ids: list[int], dim: int, data: torch.Tensor) -> None:
    expect = list(cache.shape)
    expect[dim] = len(ids)
    if list(data.shape) != expect:
        raise TransportError(f"received blocks of shape {tuple(data.shape)}, this cache needs "
                             f"{tuple(expect)}")
    index = torch.tensor(ids, dtype=torch.long, device=cache.device)
    cache.index_copy_(dim, index, data.to(cache.device))


def state_parts(cache: torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]
                ) -> list[torch.Tensor]:
    """A Mamba layer's state tensors (one raw page tensor, or conv + ssm), blocks on dim 0."""
    return [cache] if isinstance(cache, torch.Tensor) else list(cache)
