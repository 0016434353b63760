"""vLLM's idle spin (launch.py, vllm.idle_spin_s): the patch, the setting and who gets it; no
vLLM process here (the hybrid live module checks that the spin stops in a real instance)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.launch import apply_idle_spin, parse_idle_spin
from prfaas.integrations.vllm.server import (
    IDLE_SPIN_ENV,
    LAUNCH_MODULE,
    PINNED_SPIN_S,
    SERVER_MODULE,
    VllmSpec,
)
from prfaas.serve.topology import load_topology
from prfaas.serve.vllm_settings import parse_vllm

HYBRID = Path(__file__).resolve().parents[3] / "topologies" / "vllm-local.yaml"


def _spin_class() -> type:
    class Spin:  # vLLM's SpinCondition.__init__ signature (shm_broadcast.py)
        def __init__(self, is_reader: bool, context: object, notify_address: str,
                     busy_loop_s: float = 1) -> None:
            self.busy_loop_s = busy_loop_s

    return Spin


def test_the_patch_sets_the_default_every_queue_then_gets() -> None:
    spin = _spin_class()
    assert spin(True, None, "a").busy_loop_s == 1  # control: vLLM's own default
    apply_idle_spin(0.01, spin)
    assert spin(True, None, "a").busy_loop_s == 0.01
    assert spin(True, None, "a", busy_loop_s=2).busy_loop_s == 2  # an explicit value wins


def test_a_vllm_without_the_parameter_is_refused_not_ignored() -> None:
    class Renamed:
        def __init__(self, is_reader: bool, spin_s: float = 1) -> None:
            self.spin_s = spin_s

    with pytest.raises(ConfigError, match="busy_loop_s"):
        apply_idle_spin(0.01, Renamed)
    assert Renamed(True).spin_s == 1  # untouched


def test_env_values_parse_or_fail_with_the_value() -> None:
    assert parse_idle_spin("0.01") == 0.01 and parse_idle_spin("0.25") == 0.25
    for bad in ("0", "-1", "nan", "fast"):  # 0: vLLM's dropped notifications (vllm_settings.py)
        with pytest.raises(ConfigError, match=IDLE_SPIN_ENV):
            parse_idle_spin(bad)


def test_the_spec_runs_our_launcher_only_when_it_sets_a_spin_or_receives_kv() -> None:
    plain, spun = VllmSpec("m", 1), VllmSpec("m", 1, idle_spin_s=0.01)
    assert plain.command()[2] == SERVER_MODULE and IDLE_SPIN_ENV not in plain.environ()
    assert VllmSpec("m", 1, kv_role="kv_producer").command()[2] == SERVER_MODULE
    # a decoder's stream ends with its KV's wire-byte count (stream_params.py), no spin set
    receiver = VllmSpec("m", 1, kv_role="kv_consumer")
    assert receiver.command()[2] == LAUNCH_MODULE and IDLE_SPIN_ENV not in receiver.environ()
    assert spun.command()[2] == LAUNCH_MODULE and spun.environ()[IDLE_SPIN_ENV] == "0.01"
    assert parse_idle_spin(spun.environ()[IDLE_SPIN_ENV]) == 0.01  # what the launcher reads
    assert spun.command()[3:] == plain.command()[3:]  # the same vLLM arguments
    for bad in (0.0, -0.5):
        with pytest.raises(ConfigError, match="idle_spin_s"):
            VllmSpec("m", 1, idle_spin_s=bad)


def test_settings_take_auto_or_seconds() -> None:
    assert parse_vllm({}, None).idle_spin_s is None  # type: ignore[union-attr]
    assert parse_vllm({"idle_spin_s": "auto"}, None).idle_spin_s is None  # type: ignore[union-attr]
    assert parse_vllm({"idle_spin_s": 1}, None).idle_spin_s == 1.0  # type: ignore[union-attr]
    for bad in ("never", True, 0, -1, [0]):
        with pytest.raises(ConfigError, match="idle_spin_s"):
            parse_vllm({"idle_spin_s": bad}, None)
    for spin in ("auto", 0.02):  # what a dumped topology says is read back the same
        settings = parse_vllm({"idle_spin_s": spin}, None)
        assert settings is not None and parse_vllm(settings.to_dict(), None) == settings


def test_auto_sets_a_short_spin_on_pinned_instances_only() -> None:
    from prfaas.integrations.vllm.deploy import idle_spin_s, worker_spec

    topo = load_topology(HYBRID).with_ports()  # every worker pinned: prfaas-0, pdp-0 on 0
    assert {w.name: idle_spin_s(topo, w) for w in topo.workers} == {
        "prfaas-0": PINNED_SPIN_S, "pdp-0": PINNED_SPIN_S, "pdd-0": PINNED_SPIN_S}
    assert worker_spec(topo, topo.worker("pdp-0")).idle_spin_s == PINNED_SPIN_S
    unpinned = replace(topo, workers=tuple(replace(w, cores=None) for w in topo.workers))
    assert {idle_spin_s(unpinned, w) for w in unpinned.workers} == {None}  # vLLM's own
    assert worker_spec(unpinned, unpinned.worker("pdp-0")).command()[2] == SERVER_MODULE
    assert topo.vllm is not None
    fixed = replace(topo, vllm=replace(topo.vllm, idle_spin_s=0.5))
    assert {idle_spin_s(fixed, w) for w in fixed.workers} == {0.5}
