"""fp8 / bf16 on the wire (transport/quant.py): exact e4m3fn rounding, the stated round-trip bound,
the negative controls that break it, and a wrong scale that fails it.

The bound, per element x of a block-and-head with scale s (e4m3fn: 3 mantissa bits):
|x' - x| <= 2^-4 |x| when |x / s| >= 2^-6 (normal), else <= 2^-10 s (half the subnormal step);
plus float32 rounding of the divide and multiply (2 ulp, 2^-22 |x|)."""

from __future__ import annotations

import numpy as np
import pytest

from prfaas.core.errors import TransportError
from prfaas.transport.quant import (
    E4M3_VALUES,
    SCALE_SUFFIX,
    bf16_decode,
    bf16_encode,
    coarse_fp8_per_tensor,
    coarse_int4_per_tensor,
    decode_arrays,
    e4m3_decode,
    e4m3_encode,
    encode_arrays,
    fp8_dequantize,
    fp8_quantize,
)

BLOCK = 16


def _kv(seed: int = 0, tokens: int = 53, heads: int = 4, dim: int = 32) -> np.ndarray:
    """KV-like: heads whose ranges differ by orders of magnitude, a few outlier tokens."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-3, 2, size=(1, heads, 1)).astype(np.float32)
    x[rng.integers(0, tokens, 3)] *= 20
    return x


def _bound(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    s = np.repeat(scales, BLOCK, axis=0)[: x.shape[0], ..., None]
    normal = np.abs(x / s) >= 2.0**-6
    return np.where(normal, 2.0**-4 * np.abs(x), 2.0**-10 * s) + 2.0**-22 * np.abs(x)


def test_e4m3_codes_are_the_nearest_value_ties_to_even() -> None:
    finite = np.sort(E4M3_VALUES[np.isfinite(E4M3_VALUES)])
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4000) * np.exp(rng.uniform(-14, 6, 4000))).astype(np.float32)
    x = np.clip(x, -448, 448)
    got = e4m3_decode(e4m3_encode(x))
    nearest = np.abs(finite[None, :] - x[:, None]).min(axis=1)
    assert np.array_equal(np.abs(got - x), nearest)
    # ties: 1 + 1/16 lies halfway between 1 and 1.125 -> the even mantissa (1.0); 1 + 3/16 -> 1.25
    assert e4m3_decode(e4m3_encode(np.array([1.0625, 1.1875], np.float32))).tolist() == [1.0, 1.25]
    assert e4m3_encode(np.array([448.0, 1e6, -1e6], np.float32)).tolist() == [0x7E, 0x7E, 0xFE]


def test_fp8_round_trip_within_the_stated_bound() -> None:
    for seed in range(5):
        x = _kv(seed)
        codes, scales = fp8_quantize(x)
        assert codes.dtype == np.uint8 and codes.shape == x.shape
        assert scales.shape == (-(-x.shape[0] // BLOCK), x.shape[1])
        err = np.abs(fp8_dequantize(codes, scales) - x)
        assert np.all(err <= _bound(x, scales))
        # the bound is not slack: the worst element uses a good part of it
        assert (err / _bound(x, scales)).max() > 0.5


def test_bf16_round_trip_within_2_pow_minus_8() -> None:
    x = _kv(7).reshape(-1)
    err = np.abs(bf16_decode(bf16_encode(x)) - x)
    assert np.all(err <= 2.0**-8 * np.abs(x))
    assert err.max() > 0


@pytest.mark.parametrize("control", [coarse_fp8_per_tensor, coarse_int4_per_tensor])
def test_coarser_quantizers_break_the_bound(control: object) -> None:
    """The check separates: one scale per tensor (fp8) or 4 bits fail it on the same data."""
    x = _kv(3)
    _codes, scales = fp8_quantize(x)
    err = np.abs(control(x) - x)  # type: ignore[operator]
    assert np.mean(err > _bound(x, scales)) > 0.05


def test_a_wrong_scale_fails_the_bound() -> None:
    x = _kv(4)
    codes, scales = fp8_quantize(x)
    wrong = scales.copy()
    wrong[1, 2] *= 1.5  # one block of one head
    err = np.abs(fp8_dequantize(codes, wrong) - x)
    bad = err > _bound(x, scales)
    assert bad.any() and bad[BLOCK:2 * BLOCK, 2].all() and not bad[:BLOCK].any()


def test_encode_decode_arrays_on_a_layer() -> None:
    arrays = [("k", _kv(5)), ("v", _kv(6))]
    wire = encode_arrays(arrays, "fp8")
    assert [n for n, _ in wire] == ["k", "k" + SCALE_SUFFIX, "v", "v" + SCALE_SUFFIX]
    wire_bytes = sum(a.nbytes for _, a in wire)
    assert wire_bytes <= 0.26 * sum(a.nbytes for _, a in arrays)  # fp32 cache: 1/4 + scales
    back = decode_arrays(dict(wire))
    assert set(back) == {"k", "v"} and all(back[n].dtype == np.float32 for n in back)
    assert np.all(np.abs(back["k"] - arrays[0][1]) <= _bound(arrays[0][1], dict(wire)["k.scale"]))
    bf = decode_arrays(dict(encode_arrays(arrays, "bf16")))
    assert np.all(np.abs(bf["v"] - arrays[1][1]) <= 2.0**-8 * np.abs(arrays[1][1]))
    assert encode_arrays(arrays, None) is arrays


def test_decode_refuses_codes_without_scales_and_misfit_scales() -> None:
    codes, scales = fp8_quantize(_kv(0))
    with pytest.raises(TransportError, match="without"):
        decode_arrays({"k": codes})
    with pytest.raises(TransportError, match="without its codes"):
        decode_arrays({"k.scale": scales})
    with pytest.raises(TransportError, match="do not fit"):
        decode_arrays({"k": codes, "k.scale": scales[:-1]})
    with pytest.raises(TransportError, match="expected float32"):
        encode_arrays([("k", codes)], "fp8")
