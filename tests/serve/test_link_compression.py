"""`link: {compression: ...}` in a topology, and what the router makes of compressed transfers:
egress counts the bytes that crossed the wire, transfer predictions the measured wire share."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import cast

import pytest
from serve_helpers import topology

from prfaas.core.errors import ConfigError
from prfaas.models import compression
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.router.dispatch import Outcome
from prfaas.serve.router.plan import live_codec, live_plan_inputs, load_live_profile
from prfaas.serve.router.respond import Reply
from prfaas.serve.router.service import RouterService
from prfaas.serve.topology import parse_topology


def test_compression_parses_round_trips_and_refuses_unknown_codecs() -> None:
    t = topology(link={"rate_gbps": 0.5, "compression": "auto"},
                 intra_link={"rate_gbps": None, "compression": "lz4"})
    assert (t.link.compression, t.intra_link.compression) == ("auto", "lz4")
    assert parse_topology(t.to_dict()).link == t.link  # round-trips through the dump
    assert topology(link={"rate_gbps": 0.5}).link.compression == "none"  # the default
    with pytest.raises(ConfigError) as info:
        topology(link={"rate_gbps": 0.5, "compression": "brotli"})
    assert str(info.value) == ("link.compression='brotli': must be one of none, lz4, zstd, "
                               "auto")
    with pytest.raises(ConfigError, match=r"intra_link\.compression=True"):
        topology(intra_link={"compression": True})


def test_router_counts_wire_bytes_and_predicts_with_the_measured_wire_share() -> None:
    topo = topology(link={"rate_gbps": 0.5, "compression": "zstd"})
    cluster = LiveCluster(topo, engine_backend(topo).card().kv)  # no prior given: 1.0
    prfaas, pdp = topo.worker("prfaas-0"), topo.worker("pdp-0")
    raw = cluster.kv_expected_bytes(prfaas, 1000)
    assert cluster.wire_fraction(prfaas) == 1.0  # nothing reported yet: tensor bytes
    cluster.shipped(prfaas, 1_000_000, 800_000)
    assert cluster.monitor.total_sent_bytes == 800_000  # egress: what crossed the link
    assert cluster.wire_fraction(prfaas) == pytest.approx(1 - 0.2 * 0.2)  # EWMA toward 0.8
    assert cluster.kv_expected_bytes(prfaas, 1000) < raw
    assert cluster.wire_fraction(pdp) == 1.0  # the intra link learns on its own
    cluster.shipped(prfaas, 1_000_000)  # a worker that does not say: tensor bytes, no change
    assert cluster.monitor.total_sent_bytes == 1_800_000
    assert cluster.wire_fraction(prfaas) == pytest.approx(0.96)


def _native_fp32_zstd() -> float:
    return next(c.ratio for c in compression.measured_speeds("native_tiny", "fp32")
                if c.name == "zstd")


def test_router_prior_and_live_plan_use_the_measured_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any worker reports, the router predicts a compressed link's KV with the ratio
    the scenario plans with (the native engine's fp32 KV, zstd), and so does the controlled
    router's plan; an unshaped `auto` link (the rule picks none) and the intra link predict
    tensor bytes. The control: the table's zstd ratio replaced by 1.0 predicts tensor bytes,
    which the same check refuses."""
    topo = topology(link={"rate_gbps": 0.5, "compression": "zstd"})
    engine = engine_backend(topo)
    profile = load_live_profile(topo.profile)

    def predicted() -> tuple[int, int, float, float]:
        codec, ratio = live_codec(topo, engine)
        assert codec == "zstd"
        cluster = LiveCluster(topo, engine.card().kv, wire_prior=1 / ratio)
        plan = live_plan_inputs(topo)
        return (cluster.kv_expected_bytes(topo.worker("prfaas-0"), 1000),
                int(engine.card().kv.size_bytes(1000)), plan.kv.bytes_for(1000),
                profile.kv.bytes_for(1000))

    ratio = _native_fp32_zstd()  # read before the control replaces it

    def follows(p: tuple[int, int, float, float]) -> bool:
        return (abs(p[0] - p[1] / ratio) <= 1 and abs(p[2] - p[3] / ratio) <= 1e-9 * p[3])

    good = predicted()
    assert ratio > 1.05 and follows(good)
    assert LiveCluster(topo, engine.card().kv, wire_prior=0.5).wire_fraction(
        topo.worker("pdp-0")) == 1.0
    unshaped = topology(link={"rate_gbps": None, "compression": "auto"})
    assert live_codec(unshaped, engine_backend(unshaped)) == ("none", 1.0)
    table = copy.deepcopy(compression.codec_table())
    table["kv"]["native_tiny"]["fp32"]["zstd"]["ratio"] = 1.0
    monkeypatch.setattr(compression, "codec_table", lambda: table)
    wrong = predicted()
    assert wrong[0] == wrong[1] and not follows(wrong)


def test_metrics_count_the_wire_bytes_beside_the_kv_bytes() -> None:
    """/metrics: prfaas_kv_wire_bytes_total counts what crossed the link as the worker reported
    it, prfaas_kv_bytes_total the KV itself; an attempt that reports no wire bytes (a vLLM
    decoder whose stream carried no count) counts its KV bytes in both."""
    service = RouterService(topology())
    reply = cast(Reply, None)  # not read without a first token
    service._count(Outcome(route="prfaas", kv_bytes=1000, kv_wire_bytes=800), "ok", 0.0,
                   None, reply)
    service._count(Outcome(route="prfaas", kv_bytes=500), "ok", 0.0, None, reply)
    text = service.metrics.render()
    assert 'prfaas_kv_bytes_total{link="inter_dc"} 1500' in text
    assert 'prfaas_kv_wire_bytes_total{link="inter_dc"} 1300' in text


def test_vllm_codec_choice_needs_no_model_files(tmp_path: Path) -> None:
    """The router plans before `prfaas serve` builds the model: a vLLM topology's codec figures
    come from its architecture, not from the model's config.json (a fresh clone failed here when
    they were read from the model). Control: the two architectures pick different measured KV."""
    import yaml

    repo = Path(__file__).resolve().parents[2]
    picked = {}
    for arch in ("llama", "qwen3_next"):
        raw = yaml.safe_load((repo / "topologies" / "vllm-local.yaml").read_text())
        raw["vllm"]["model"] = {"arch": arch, "dir": str(tmp_path / "not-built" / arch)}
        topo = parse_topology(raw)
        assert not (tmp_path / "not-built").exists()
        picked[arch] = engine_backend(topo).codec_kv()
    assert picked == {"llama": "vllm_tiny_llama", "qwen3_next": "vllm_tiny_qwen3_next"}
