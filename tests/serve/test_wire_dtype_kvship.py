"""fp8 on the wire in the native KV shipment (kvship + manifest), without a deployment: the
manifest digests the fp8 codes and scales as they travel, so a wrong scale is refused; the
decode side rebuilds float32 within the fp8 bound; linear states travel untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from prfaas.engine import LayerKV
from prfaas.models.engine_config import LAYER_KINDS
from prfaas.serve.worker.kvship import layer_arrays, read_shipped
from prfaas.serve.worker.manifest import Binding, IntegrityError, ManifestBuilder, verify
from prfaas.transport import ReceivedKV
from prfaas.transport.quant import SCALE_SUFFIX

META = 0xFFFF


def _layers() -> list[LayerKV]:
    g = torch.Generator().manual_seed(0)
    mla = LayerKV(1, "mla", 0, 40, {"latent": torch.randn(40, 128, generator=g),
                                    "k_rope": torch.randn(40, 32, generator=g)})
    lin = LayerKV(0, "linear", 0, 40, {"state": torch.randn(4, 8, 8, generator=g),
                                       "conv": torch.randn(3, 24, generator=g)})
    return [lin, mla]


def _received(tamper: bool = False) -> tuple[ReceivedKV, Binding]:
    binding = Binding(7, "nonce", "model", "KM", 0, tuple(range(40)))
    shipped: dict[int, dict[str, np.ndarray]] = {}
    kinds: dict[int, str] = {}

    async def build() -> bytes:
        builder = ManifestBuilder(binding)
        for layer in _layers():
            for name, array in layer_arrays(layer, "fp8_e4m3"):
                builder.add(layer.layer_index, name, array)
                shipped.setdefault(layer.layer_index, {})[name] = array.copy()
            kinds[layer.layer_index] = layer.kind
        meta = {"logits": np.zeros(258, np.float32), "snap_at": np.zeros(1, np.int64)}
        for name, array in meta.items():
            builder.add(META, name, array)
        shipped[META], kinds[META] = meta, "none"
        return await builder.encode()

    manifest = asyncio.run(build())
    if tamper:
        shipped[1]["latent" + SCALE_SUFFIX][0] *= 2  # one block's scale, doubled
    return ReceivedKV(7, shipped, kinds, frozenset(), 0, 0.0, 0.0, manifest), binding


def test_fp8_shipment_travels_codes_and_scales_and_verifies() -> None:
    received, binding = _received()
    assert received.layers[1]["latent"].dtype == np.uint8
    assert received.layers[1]["latent" + SCALE_SUFFIX].shape == (3, )  # ceil(40 / 16) blocks
    assert received.layers[0]["state"].dtype == np.float32  # linear state: never encoded
    verify(received, binding, LAYER_KINDS)
    layers = read_shipped(received, 2).layers
    src = _layers()
    assert torch.equal(layers[0].tensors["state"], src[0].tensors["state"])
    x, y = src[1].tensors["latent"], layers[1].tensors["latent"]
    assert y.dtype == torch.float32 and set(layers[1].tensors) == {"latent", "k_rope"}
    # bound (transport/quant.py): 2^-4 |x| (normal) or 2^-10 s (subnormal), s = block absmax/448
    s = x.reshape(-1).abs().max() / 448  # >= every block's scale
    assert torch.all((y - x).abs() <= 2**-4 * x.abs() + 2**-10 * s + 1e-7)
    assert not torch.equal(x, y)


def test_a_wrong_scale_is_refused_by_the_manifest() -> None:
    received, binding = _received(tamper=True)
    with pytest.raises(IntegrityError, match=r"layer 1 'latent.scale' bytes do not match"):
        verify(received, binding, LAYER_KINDS)


def test_topology_wire_dtype_native_and_vllm() -> None:
    import yaml
    from serve_helpers import topology

    from prfaas.core.errors import ConfigError
    from prfaas.serve.topology import parse_topology

    t = topology(link={"rate_gbps": 0.5, "connections": 2, "wire_dtype": "fp8"})
    assert t.link.wire_dtype == "fp8_e4m3" and t.intra_link.wire_dtype is None
    assert parse_topology(t.to_dict()).link == t.link  # round-trips through the dump
    with pytest.raises(ConfigError, match="wire_dtype='int4'"):
        topology(link={"rate_gbps": 0.5, "wire_dtype": "int4"})
    repo = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((repo / "topologies" / "vllm-local.yaml").read_text())
    raw["link"] = {**raw.get("link", {}), "wire_dtype": "fp8"}
    vllm = parse_topology(raw)  # PrfaasConnector encodes fp8 (integrations/vllm/wire_quant.py)
    from prfaas.integrations.vllm.deploy import worker_spec

    extra = {w.name: worker_spec(vllm, w).extra for w in vllm.workers}
    assert extra["prfaas-0"]["wire_dtype"] == "fp8_e4m3"  # the inter-DC link's producer
    assert "wire_dtype" not in extra["pdp-0"] and "wire_dtype" not in extra["pdd-0"]
    raw["link"]["wire_dtype"] = "bf16"  # not encoded by the connector: refused, not ignored
    with pytest.raises(ConfigError, match="engine vllm ships KV as cached; it encodes fp8_e4m3"):
        parse_topology(raw)


def test_live_plan_of_a_vllm_topology_takes_fp8_against_its_bf16_cache() -> None:
    """A vLLM profile's KV is a fitted slope of bf16 blocks (no geometry): with fp8 on the link
    the plan takes half of it plus the scales, not the quarter an fp32 cache would give."""
    import yaml

    from prfaas.serve.router.plan import live_plan_inputs, load_live_profile
    from prfaas.serve.topology import parse_topology

    repo = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((repo / "topologies" / "vllm-local.yaml").read_text())
    plain = parse_topology(raw)
    raw["link"] = {**raw["link"], "wire_dtype": "fp8_e4m3"}
    fp8 = parse_topology(raw)
    profile = load_live_profile("vllm-qwen3-next-cpu")
    assert profile.kv.geometry is None  # the fitted case, where the cache dtype matters
    ratio = (live_plan_inputs(fp8, profile).kv.per_token_bytes
             / live_plan_inputs(plain, profile).kv.per_token_bytes)
    assert 0.5 < ratio < 0.505, ratio  # 1 byte + 4 per 16 x 64 elements, of bf16's 2
