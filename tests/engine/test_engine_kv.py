"""SequenceKV: sizes agree with the planner's geometry, exports, prefixes share paged blocks,
snapshots exist only at block boundaries, the numpy wire helpers are exact and zero-copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_factories import engine, prompt

from prfaas.core.errors import ConfigError
from prfaas.engine import layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.engine.kv import AttnStore
from prfaas.models.kv import geometry
from prfaas.models.spec import parse_spec, spec_to_dict


@pytest.mark.parametrize("name", ["kimi", "mimo", "mixed"])
@pytest.mark.parametrize("length", [1, 70, 250])
def test_byte_size_equals_spec_geometry(name: str, length: int) -> None:
    eng = engine(name)
    kv = eng.prefill(prompt(length)).kv
    assert kv.byte_size() == geometry(eng.config.to_spec()).size_bytes(length)


def test_spec_round_trips_through_models_json_format() -> None:
    spec = engine("mixed").config.to_spec()
    assert parse_spec(spec_to_dict(spec)).layers == spec.layers
    kinds = {g.kind for g in spec.layers}
    assert kinds == {"linear", "gqa", "swa", "mla"}


def test_export_ranges_and_tensor_shapes() -> None:
    eng = engine("mixed")  # K G S M, window 80
    kv = eng.prefill(prompt(200)).kv
    layers = kv.export(128, 200)
    by_kind = {layer.kind: layer for layer in layers}
    assert by_kind["linear"].tensors["state"].shape == (4, 64, 64)
    assert by_kind["linear"].tensors["conv"].shape == (3, 768)
    assert by_kind["gqa"].tensors["k"].shape == (72, 2, 64)
    assert by_kind["mla"].tensors["latent"].shape == (72, 128)
    assert by_kind["mla"].tensors["k_rope"].shape == (72, 32)
    assert (by_kind["swa"].start_token, by_kind["swa"].tensors["v"].shape[0]) == (120, 80)


def test_prefix_shares_full_blocks_and_is_not_disturbed_by_appends() -> None:
    eng = engine("kimi")
    ids = prompt(200)
    kv = eng.prefill(ids).kv
    prefix = kv.snapshot_at(128)
    store, pstore = kv.stores[3], prefix.stores[3]
    assert isinstance(store, AttnStore) and isinstance(pstore, AttnStore)
    assert all(a["latent"] is b["latent"] for a, b in zip(pstore.blocks, store.blocks[:2],
                                                          strict=False))
    before = [t.clone() for t in pstore.gather(0, 128).values()]
    eng.prefill(ids[:128] + prompt(90, seed=5), prefix=prefix)  # appends after the prefix
    assert all(torch.equal(a, b) for a, b in zip(before, pstore.gather(0, 128).values(),
                                                 strict=True))
    assert prefix.num_tokens == 128


def test_snapshot_only_at_block_boundaries() -> None:
    kv = engine("kimi").prefill(prompt(150)).kv
    assert kv.snapshot_at(150).num_tokens == 150  # the full length is always available
    with pytest.raises(ConfigError, match="snapshot"):
        kv.snapshot_at(100)
    with pytest.raises(ConfigError):
        kv.export(0, 151)


def test_held_bytes_counts_snapshots() -> None:
    kv = engine("kimi").prefill(prompt(256)).kv
    state_bytes = 6 * (4 * 64 * 64 + 3 * 768) * 4
    assert kv.held_bytes() - kv.byte_size() >= 3 * state_bytes  # snapshots at 64, 128, 192


def test_wire_helpers_are_exact_and_zero_copy() -> None:
    kv = engine("mixed").prefill(prompt(100)).kv
    for layer in kv.export(0, 100):
        arrays = layer_kv_to_arrays(layer)
        assert [n for n, _ in arrays] == sorted(layer.tensors)
        for name, array in arrays:
            assert array.dtype == np.float32
            assert np.shares_memory(array, layer.tensors[name].numpy())
        back = layer_kv_from_arrays(layer.layer_index, layer.kind, layer.start_token,
                                    layer.end_token, arrays)
        for name, tensor in back.tensors.items():
            assert torch.equal(tensor, layer.tensors[name])
            assert np.shares_memory(tensor.numpy(), dict(arrays)[name])


def test_wire_helpers_reject_bad_input() -> None:
    with pytest.raises(ConfigError, match="float32"):
        layer_kv_from_arrays(0, "mla", 0, 1, [("latent", np.zeros((1, 4), np.float64))])
    with pytest.raises(ConfigError, match="kind"):
        layer_kv_from_arrays(0, "rnn", 0, 1, [])
    ro = np.zeros((2, 4), np.float32)
    ro.flags.writeable = False
    assert layer_kv_from_arrays(0, "mla", 0, 2, [("latent", ro)]).tensors["latent"].shape == (2, 4)
