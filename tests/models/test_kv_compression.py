"""Lossless compression in the plan and the simulation: the scenario's `link.compression`
shrinks S_kv(l) on the wire by the ratio measured on real KV (data/codec_speeds.json, copied
from benchmarks/results/transport.json), `auto` decides by the live sender's rule, and the
codec's measured per-connection rate caps a simulated transfer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.models import compression
from prfaas.planner.search import plan_all
from prfaas.scenario import Scenario, load_scenario, parse_scenario
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic

TRANSPORT_JSON = Path(__file__).resolve().parents[2] / "benchmarks/results/transport.json"


def _scenario(name: str, **link: Any) -> Scenario:
    base = load_scenario(name)
    raw = copy.deepcopy(base.raw)
    raw["link"].update(link)
    return parse_scenario(raw, base.path)


def _zstd(kv: str, dtype: str) -> compression.CodecSpeed:
    return next(s for s in compression.measured_speeds(kv, dtype) if s.name == "zstd")


def test_codec_table_is_the_measured_one() -> None:
    """Every figure the package reads is the one transport.json holds, and none is left out
    (benchmarks/sync_codec_speeds.py copies them; a rerun of codec_figures.py without it
    fails here)."""
    measured = json.loads(TRANSPORT_JSON.read_text())["compression"]
    table = compression.codec_table()["kv"]
    copied = {f"{kv}_{dtype}": codecs for kv, by in table.items() for dtype, codecs in by.items()}
    assert set(copied) == {k for k, v in measured.items() if isinstance(v, dict) and "codecs" in v}
    for key, codecs in copied.items():
        assert codecs == {name: {f: c[f] for f in ("ratio", "compress_gbps", "decompress_gbps")}
                          for name, c in measured[key]["codecs"].items()}, key


def test_zstd_divides_the_wire_bytes_by_the_measured_ratio() -> None:
    none, zstd = _scenario("public-internet"), _scenario("public-internet", compression="zstd")
    ratio = _zstd("native_tiny", "bf16").ratio  # the paper's KV is bf16
    assert ratio > 1.1 and zstd.wire_codec == "zstd"
    for length in (1024.0, 32768.0):
        assert zstd.wire_kv.bytes_for(length) == pytest.approx(none.wire_kv.bytes_for(length)
                                                               / ratio, rel=1e-12)
    fp8z = _scenario("public-internet", compression="zstd", wire_dtype="fp8")
    fp8 = _scenario("public-internet", wire_dtype="fp8")
    assert fp8z.wire_kv.per_token_bytes == pytest.approx(
        fp8.wire_kv.per_token_bytes / _zstd("native_tiny", "fp8_e4m3").ratio, rel=1e-12)
    assert fp8z.wire_kv.fixed_bytes < fp8.wire_kv.fixed_bytes  # the state is compressed too


def _planned_egress(s: Scenario) -> tuple[float, int]:
    plan = plan_all(s, mode="exact").systems["prfaas_pd"]
    assert plan.threshold_tokens is not None
    return plan.egress_gbps, plan.threshold_tokens


def test_plan_egress_follows_the_ratio_and_a_wrong_ratio_changes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PrfaaS-PD on public-internet is compute-bound, so its threshold and rate do not move
    and its planned egress is the uncompressed one over the measured ratio. The control: the
    same scenario with the table's zstd ratio replaced by 1.0 (zstd on, nothing saved) plans
    the uncompressed egress, which the same check refuses."""
    none_gbps, t_none = _planned_egress(_scenario("public-internet"))
    zstd_gbps, t_zstd = _planned_egress(_scenario("public-internet", compression="zstd"))
    ratio = _zstd("native_tiny", "bf16").ratio
    assert t_zstd == t_none

    def follows(gbps: float) -> bool:
        return abs(gbps - none_gbps / ratio) <= 1e-9 * none_gbps

    assert follows(zstd_gbps)
    table = copy.deepcopy(compression.codec_table())
    table["kv"]["native_tiny"]["bf16"]["zstd"]["ratio"] = 1.0
    monkeypatch.setattr(compression, "codec_table", lambda: table)
    wrong = _scenario("public-internet", compression="zstd")
    assert wrong.wire_codec == "zstd"
    wrong_gbps, _ = _planned_egress(wrong)
    assert wrong_gbps == pytest.approx(none_gbps, rel=1e-12)
    assert not follows(wrong_gbps)


def test_simulated_transfers_move_the_compressed_bytes() -> None:
    """The same 300 requests through the simulator with and without zstd, the threshold fixed:
    the same requests cross the link and each moves its uncompressed bytes over the ratio."""
    runs = {}
    for codec in ("none", "zstd"):
        s = _scenario("public-internet", compression=codec)
        cfg = build_system(s, "prfaas_pd", threshold_tokens=19500, plan_mode="paper")
        work = synthetic(s.lengths, s.output_tokens, make_arrivals("uniform"), 2.0, 300, 3)
        sim, _ = simulate(cfg, work)
        runs[codec] = np.asarray(sim.log.kv_bytes, dtype=float)
    remote = runs["none"] > 0
    assert remote.sum() > 20 and np.array_equal(remote, runs["zstd"] > 0)
    ratio = _zstd("native_tiny", "bf16").ratio
    np.testing.assert_allclose(runs["zstd"][remote], runs["none"][remote] / ratio, rtol=1e-9)


def test_auto_and_the_codec_rate_cap() -> None:
    """`auto` is the live sender's rule on the scenario's link: at 20.58 Gbps over 8
    connections zstd beats a connection's share, at 100 Gbps over one it does not; a forced
    codec caps each simulated transfer at connections x its slower side / ratio."""
    assert _scenario("public-internet", compression="auto").wire_codec == "zstd"
    auto100 = _scenario("link-fluctuation", compression="auto")
    assert auto100.wire_codec == "none" and auto100.wire_kv is auto100.kv
    forced = _scenario("link-fluctuation", compression="zstd")
    z = _zstd("native_tiny", "bf16")
    cap = min(z.compress_gbps, z.decompress_gbps) / z.ratio  # one connection
    assert build_system(forced, "prfaas_pd", plan_mode="paper").flow_cap_gbps == cap
    assert build_system(auto100, "prfaas_pd", plan_mode="paper").flow_cap_gbps is None
    assert build_system(forced, "prfaas_pd", plan_mode="paper").cache_kv is forced.kv


def test_bad_compression_settings_name_the_value() -> None:
    with pytest.raises(ConfigError, match="brotli"):
        _scenario("public-internet", compression="brotli")
    with pytest.raises(ConfigError, match="gzip_kv"):
        _scenario("public-internet", compression="zstd", codec_kv="gzip_kv")
    with pytest.raises(ConfigError, match="fp8_e4m3 on the wire"):  # measured on bf16 only
        _scenario("public-internet", compression="zstd", codec_kv="vllm_tiny_llama",
                  wire_dtype="fp8")
    # no codec asked: the figures are not needed, so an unmeasured pairing is fine
    _scenario("public-internet", codec_kv="vllm_tiny_llama", wire_dtype="fp8")
