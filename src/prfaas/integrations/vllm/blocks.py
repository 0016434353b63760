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


# -- recurrent-state slots and the conv-state layout ------------------------------------------
# vLLM stores a Mamba/GDN conv state either SD `(state_len, dim)` or DS `(dim, state_len)`
# (VLLM_SSM_CONV_STATE_LAYOUT; its CPU platform picks SD on AVX-512-BF16 CPUs, NIXL needs DS).
# The bytes differ, so the wire carries one canonical layout, DS, and each end converts: a
# prefill instance in SD and a decoder in DS (or the reverse) still agree on every value.
WIRE_CONV_LAYOUT = "DS"


def _conv_region(slot: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype
                 ) -> torch.Tensor:
    """The conv state inside one slot: a raw byte page (conv first, as vLLM packs a Mamba page)
    or already the conv tensor; a view with the state's own shape and dtype."""
    if slot.dtype == dtype and tuple(slot.shape[-len(shape):]) == tuple(shape):
        return slot.reshape(shape)
    flat = slot.reshape(-1).view(torch.uint8)
    nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    if flat.numel() < nbytes:
        raise TransportError(f"state slot of {flat.numel()} B is smaller than its conv state "
                             f"{tuple(shape)} {dtype}")
    return flat[:nbytes].view(dtype).view(shape)


def conv_to_wire(slot: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                 layout: str) -> torch.Tensor:
    """A copy of one state slot (part 0 of a Mamba layer) with its conv state in WIRE_CONV_LAYOUT;
    `shape` is the conv state's local shape, `layout` the local "SD" or "DS"."""
    out = slot.detach().contiguous().clone()  # on the slot's device (the shipper copies it)
    if layout != WIRE_CONV_LAYOUT:
        conv = _conv_region(out, shape, dtype)
        conv.view(-1).copy_(conv.transpose(-1, -2).contiguous().view(-1))
    return out


def conv_from_wire(data: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                   layout: str) -> torch.Tensor:
    """The inverse of conv_to_wire at the receiver: the slot with the conv state in `layout`."""
    out = data.contiguous().clone()
    if layout != WIRE_CONV_LAYOUT:
        conv = _conv_region(out, shape, dtype)
        wire = conv.reshape(-1).clone().view(shape[-1], shape[-2])  # DS: (dim, state_len)
        conv.copy_(wire.transpose(0, 1))
    return out


def conv_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
