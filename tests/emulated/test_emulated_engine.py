"""The emulated engine: profile-driven time, geometry-shaped KV, tokens that depend on the KV."""

import pytest
import torch

from prfaas.core.errors import ConfigError
from prfaas.emulated.backend import emulated_engine, hardware_for, scaled_from_model
from prfaas.emulated.engine import EmulatedEngine
from prfaas.engine import DecodeSeq, LayerKV

MODEL = {"backend": "emulated", "scenario": "paper-case-study", "system": "prfaas_pd"}


class Clock:
    """A fake clock: records what the engine asks to sleep and advances instead."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.t = 0.0

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds

    def now(self) -> float:
        return self.t


def engines(clock: Clock) -> tuple[EmulatedEngine, EmulatedEngine]:
    p, d = emulated_engine(MODEL, "prfaas"), emulated_engine(MODEL, "pd-d")
    p._sleep = d._sleep = clock
    p._now = d._now = clock.now
    return p, d


def prompt(n: int, salt: int = 0) -> list[int]:
    return [(i * 31 + salt) % 256 for i in range(n)]


def test_prefill_spends_the_profiles_time_layer_by_layer() -> None:
    clock = Clock()
    p, _ = engines(clock)
    layers: list[LayerKV] = []
    result = p.prefill(prompt(2000), None, layers.append)
    expected = p.prefill_time.seconds(2000)
    assert sum(clock.slept) == pytest.approx(expected, rel=1e-9)
    assert len(clock.slept) == len(layers) == p.layout.num_layers
    assert [x.layer_index for x in layers] == list(range(p.layout.num_layers))
    assert result.kv.byte_size() == p.layout.size_bytes(2000)


def test_kv_reaching_the_decoder_gives_generates_tokens() -> None:
    clock = Clock()
    p, d = engines(clock)
    ids = prompt(3000)
    layers: list[LayerKV] = []
    result = p.prefill(ids, None, layers.append)
    seq = DecodeSeq(d.import_kv(layers, None, ids), result.first_token)
    out = [result.first_token] + [d.decode_step([seq])[0] for _ in range(7)]
    assert out == p.generate(ids, 8)
    assert clock.slept[-1] == pytest.approx(d.decode_time.step_at(1), rel=0.05)


def test_another_requests_or_corrupt_kv_gives_other_tokens() -> None:
    p, d = engines(Clock())
    ids, other = prompt(500), prompt(500, salt=1)
    layers: list[LayerKV] = []
    p.prefill(other, None, layers.append)
    wrong = DecodeSeq(d.import_kv(layers, None, ids), 0)
    assert [d.decode_step([wrong])[0] for _ in range(6)] != p.generate(ids, 7)[1:]
    layers = []
    p.prefill(ids, None, layers.append)
    bad = layers[3].tensors["rows"].clone()
    bad[10, 0] += 1.0
    layers[3] = LayerKV(3, layers[3].kind, layers[3].start_token, layers[3].end_token,
                        {"rows": bad})
    flipped = DecodeSeq(d.import_kv(layers, None, ids), 0)
    assert [d.decode_step([flipped])[0] for _ in range(6)] != p.generate(ids, 7)[1:]


def test_batched_decode_is_per_request_and_sleeps_one_step() -> None:
    clock = Clock()
    p, d = engines(clock)
    seqs, refs = [], []
    for salt in range(5):
        ids = prompt(100 + 10 * salt, salt)
        layers: list[LayerKV] = []
        r = p.prefill(ids, None, layers.append)
        seqs.append(DecodeSeq(d.import_kv(layers, None, ids), r.first_token))
        refs.append(p.generate(ids, 4))
    clock.slept.clear()
    steps = [d.decode_step(seqs) for _ in range(3)]
    assert len(clock.slept) == 3
    for i, ref in enumerate(refs):
        assert [s[i] for s in steps] == ref[1:]


def test_import_rejects_misshapen_layers() -> None:
    p, d = engines(Clock())
    layers: list[LayerKV] = []
    p.prefill(prompt(64), None, layers.append)
    layers[0] = LayerKV(0, "linear", 0, 64, {"state": torch.zeros(3)})
    with pytest.raises(ConfigError, match="state"):
        d.import_kv(layers, None, prompt(64))
    with pytest.raises(ConfigError, match="layers"):
        d.import_kv(layers[:-1], None, prompt(64))


def test_roles_take_their_systems_hardware() -> None:
    scaled, _ = scaled_from_model(MODEL)
    assert hardware_for(scaled, "prfaas_pd", "prfaas").name == "h200"
    assert hardware_for(scaled, "prfaas_pd", "pd-p").name == "h20"
    assert hardware_for(scaled, "naive_heterogeneous", "prfaas").name == "h200"
    with pytest.raises(ConfigError, match="no pd-p"):
        hardware_for(scaled, "naive_heterogeneous", "pd-p")


def test_control_slowdown_slows_the_workers_not_the_routers_prior() -> None:
    """The negative-control knob: workers sleep 1.05x their profile (prefill and decode), the
    profile itself (the router's prior and the simulator's input) is unchanged; 1.0 (the
    default, the control's control) sleeps the profile's time exactly."""
    ids = prompt(2000)
    slept = {}
    for factor in (1.0, 1.05):
        model = {**MODEL, "control_slowdown": factor} if factor != 1.0 else MODEL
        clock = Clock()
        p, d = emulated_engine(model, "prfaas"), emulated_engine(model, "pd-d")
        p._sleep = d._sleep = clock
        p._now = d._now = clock.now
        layers: list[LayerKV] = []
        r = p.prefill(ids, None, layers.append)
        prefill_s = sum(clock.slept)
        d.decode_step([DecodeSeq(d.import_kv(layers, None, ids), r.first_token)])
        slept[factor] = (prefill_s, clock.slept[-1])
        assert p.prefill_time is not None and d.decode_time is not None
        assert prefill_s == pytest.approx(factor * p.prefill_time.seconds(2000), rel=1e-9)
        assert clock.slept[-1] == pytest.approx(factor * d.decode_time.step_at(1), rel=0.05)
    assert slept[1.05][0] == pytest.approx(1.05 * slept[1.0][0], rel=1e-9)
    scaled, _ = scaled_from_model({**MODEL, "control_slowdown": 1.05})
    assert hardware_for(scaled, "prfaas_pd", "prfaas").prefill == \
        hardware_for(scaled_from_model(MODEL)[0], "prfaas_pd", "prfaas").prefill
    for bad in (0.9, 11, "1.05", True):
        with pytest.raises(ConfigError, match="control_slowdown"):
            emulated_engine({**MODEL, "control_slowdown": bad}, "prfaas")
