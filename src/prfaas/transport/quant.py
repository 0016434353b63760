"""Lossy wire dtypes for full-attention KV: bf16, and fp8 (e4m3fn) with per-block-per-head scales.

The sender calls `encode_arrays` on a full-attention layer's float32 arrays, the receiver
`decode_arrays` on what arrived (docs/wire-format.md, "Wire dtype"):

- `bf16`: each float32 rounded to nearest-even bf16, sent as its 2-byte word (uint16).
- `fp8_e4m3`: an array [T, *heads, D] (T tokens) is cut into blocks of 16 tokens
  (`WIRE_SCALE_BLOCK_TOKENS`); every (block, head) has one float32 scale s = absmax / 448, and
  each element travels as the e4m3fn code of x / s (round to nearest even; 448 is e4m3fn's
  largest finite value, so nothing saturates). The codes keep the array's name and shape as
  uint8; the scales travel beside them as float32 `<name>.scale` of shape [ceil(T/16), *heads].
  Per block and head, not per tensor: a head's range differs from its neighbour's by orders of
  magnitude, and a block bounds how far one outlier token widens the step of the others.

Error bound (tests/transport/test_quant.py): with 3 mantissa bits, an element whose scaled value
is normal (|x/s| >= 2^-6) is off by at most 2^-4 of itself; a subnormal one by at most half the
subnormal step, 2^-10 * s (underflow). bf16: at most 2^-8 of itself. Linear-attention states and
SWA windows are never encoded (small; a recurrent state's error compounds at every later token).
Numpy only (numpy has no float8): the e4m3fn rounding is done on the float32 bit patterns.
"""

from __future__ import annotations

import numpy as np

from prfaas.core.errors import TransportError
from prfaas.models.kv import WIRE_SCALE_BLOCK_TOKENS, wire_dtype_name

E4M3_MAX = 448.0
SCALE_SUFFIX = ".scale"
_SUBNORMAL_MIN_NORMAL = 2.0**-6  # smallest normal e4m3fn value
_SUBNORMAL_STEP = 2.0**-9


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn codes (0x7f / 0xff are NaN)."""
    codes = np.arange(128)
    exp, mant = codes >> 3, codes & 7
    pos = np.where(exp == 0, mant * _SUBNORMAL_STEP, (1 + mant / 8.0) * 2.0 ** (exp - 7.0))
    pos[0x7F] = np.nan
    return np.concatenate([pos, -pos]).astype(np.float32)


E4M3_VALUES = _e4m3_table()


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn codes of float32 `x` (nearest, ties to even; |x| beyond 448 clamps)."""
    x = np.asarray(x, dtype=np.float32)
    sign = ((x.view(np.uint32) >> 24) & 0x80).astype(np.uint8)
    a = np.minimum(np.abs(x), np.float32(E4M3_MAX))
    bits = a.view(np.uint32)
    # keep 3 of float32's 23 mantissa bits, round to nearest even, re-bias the exponent 127 -> 7
    kept = (bits + np.uint32(0x7FFFF) + ((bits >> 20) & 1)) >> 20
    normal = kept - np.uint32((127 - 7) << 3)
    subnormal = np.rint(a * np.float32(1 / _SUBNORMAL_STEP)).astype(np.uint32)  # 8 -> 2^-6
    code = np.where(a < _SUBNORMAL_MIN_NORMAL, subnormal, normal).astype(np.uint8)
    return code | sign


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 words of float32 `x` (nearest, ties to even)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_decode(words: np.ndarray) -> np.ndarray:
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    """[T, *heads, D] -> [nb, block, *heads, D], the last block zero-padded."""
    nb = -(-x.shape[0] // block)
    pad = nb * block - x.shape[0]
    if pad:
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), dtype=x.dtype)])
    return x.reshape(nb, block, *x.shape[1:])


def fp8_scales(x: np.ndarray, block: int = WIRE_SCALE_BLOCK_TOKENS) -> np.ndarray:
    """float32 [ceil(T/block), *heads]: absmax / 448 of each (block, head); 1 where all zero."""
    if x.ndim < 2:
        raise TransportError(f"fp8 wire: shape={x.shape}: need [tokens, ..., dim]")
    absmax = np.abs(_blocks(x, block)).max(axis=(1, -1))
    return np.where(absmax > 0, absmax / np.float32(E4M3_MAX), 1).astype(np.float32)


def _broadcast(scales: np.ndarray, num_tokens: int, block: int) -> np.ndarray:
    """[nb, *heads] -> [T, *heads, 1]."""
    return np.repeat(scales, block, axis=0)[:num_tokens, ..., None]


def fp8_quantize(x: np.ndarray, block: int = WIRE_SCALE_BLOCK_TOKENS
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes shaped like x, float32 scales [ceil(T/block), *heads])."""
    x = np.asarray(x, dtype=np.float32)
    scales = fp8_scales(x, block)
    return e4m3_encode(x / _broadcast(scales, x.shape[0], block)), scales


def fp8_dequantize(codes: np.ndarray, scales: np.ndarray,
                   block: int = WIRE_SCALE_BLOCK_TOKENS) -> np.ndarray:
    want = (-(-codes.shape[0] // block), *codes.shape[1:-1]) if codes.ndim >= 2 else None
    if want is None or scales.shape != want or scales.dtype != np.float32:
        raise TransportError(f"fp8 wire: scales {scales.dtype}{list(scales.shape)} do not fit "
                             f"codes {list(codes.shape)} (need float32{list(want or ())})")
    out: np.ndarray = e4m3_decode(codes) * _broadcast(scales, codes.shape[0], block)
    return out


def encode_arrays(arrays: list[tuple[str, np.ndarray]], wire_dtype: str | None
                  ) -> list[tuple[str, np.ndarray]]:
    """A full-attention layer's float32 arrays as they travel in `wire_dtype` (None: as is)."""
    name = wire_dtype_name(wire_dtype)
    if name is None:
        return arrays
    out: list[tuple[str, np.ndarray]] = []
    for tensor, array in arrays:
        if array.dtype != np.float32:
            raise TransportError(f"{name} wire: {tensor!r} is {array.dtype}, expected float32")
        if name == "bf16":
            out.append((tensor, bf16_encode(array)))
            continue
        codes, scales = fp8_quantize(array)
        out += [(tensor, codes), (tensor + SCALE_SUFFIX, scales)]
    return out


def decode_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32 arrays back from what arrived: uint16 is bf16, uint8 is fp8 with `<name>.scale`;
    float32 arrives as is. A scale without codes, or codes without a scale, is an error."""
    out: dict[str, np.ndarray] = {}
    for tensor, array in arrays.items():
        if tensor.endswith(SCALE_SUFFIX):
            if tensor.removesuffix(SCALE_SUFFIX) not in arrays:
                raise TransportError(f"fp8 wire: {tensor!r} arrived without its codes")
            continue
        if array.dtype == np.uint16:
            out[tensor] = bf16_decode(array)
        elif array.dtype == np.uint8:
            scales = arrays.get(tensor + SCALE_SUFFIX)
            if scales is None:
                raise TransportError(f"fp8 wire: {tensor!r} arrived without {SCALE_SUFFIX}")
            out[tensor] = fp8_dequantize(array, scales)
        else:
            out[tensor] = array
    return out


def coarse_fp8_per_tensor(x: np.ndarray) -> np.ndarray:
    """Negative control (benchmarks, tests): fp8 with ONE scale for the whole tensor."""
    x = np.asarray(x, dtype=np.float32)
    absmax = float(np.abs(x).max()) if x.size else 0.0
    scale = np.float32(absmax / E4M3_MAX if absmax > 0 else 1.0)
    out: np.ndarray = e4m3_decode(e4m3_encode(x / scale)) * scale
    return out


def coarse_int4_per_tensor(x: np.ndarray) -> np.ndarray:
    """Negative control: symmetric 4-bit integers (-7..7) with one scale per tensor."""
    x = np.asarray(x, dtype=np.float32)
    absmax = float(np.abs(x).max()) if x.size else 0.0
    scale = np.float32(absmax / 7 if absmax > 0 else 1.0)
    out: np.ndarray = (np.clip(np.rint(x / scale), -7, 7) * scale).astype(np.float32)
    return out
