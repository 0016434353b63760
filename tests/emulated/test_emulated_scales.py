"""The unit mapping keeps every stage's capacity ratio; inputs that cannot keep it fail."""

import pytest

from prfaas.core.errors import ConfigError
from prfaas.emulated.layout import build_layout, pattern_of
from prfaas.emulated.scales import Scales, scale_lengths, scale_scenario
from prfaas.models.catalog import find_model
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario


@pytest.mark.parametrize("name", ["paper-case-study", "roofline-b200-qwen3-next"])
def test_every_stage_capacity_is_the_scenarios_over_the_time_scale(name: str) -> None:
    s = load_scenario(name)
    sc = Scales(time=0.2, bytes=2e-3, tokens=8, output=64)
    scaled = scale_scenario(s, sc).scenario
    orig, live = plan_all(s, mode="exact"), plan_all(scaled, mode="exact")
    for system in ("homogeneous_pd", "naive_heterogeneous"):  # no threshold: exact stages
        a, b = orig.systems[system], live.systems[system]
        for key in ("theta_prfaas", "theta_pd_p", "theta_pd_d", "lambda_max"):
            va, vb = getattr(a, key), getattr(b, key)
            if va is None:
                assert vb is None
                continue
            # lengths rounded to whole live tokens: E[T(L)] moves by < 0.5%
            assert vb * sc.time == pytest.approx(va, rel=5e-3), (system, key)

    def ratio(p: object) -> float:
        systems = p.systems  # type: ignore[attr-defined]
        return float(systems["prfaas_pd"].lambda_max / systems["homogeneous_pd"].lambda_max)

    assert ratio(live) == pytest.approx(ratio(orig), rel=1e-2)
    assert live.systems["prfaas_pd"].n_p == orig.systems["prfaas_pd"].n_p


def test_link_and_kv_scale_together() -> None:
    s = load_scenario("paper-case-study")
    sc = Scales(time=0.5, bytes=1e-3, tokens=4, output=32)
    out = scale_scenario(s, sc)
    assert out.scenario.link_gbps == pytest.approx(100 * 1e-3 / 0.5)
    # one live token carries `tokens` scenario tokens' KV, rounded to whole float32 values
    exact = s.kv.bytes_for(4 * 1000) * 1e-3
    assert out.layout.size_bytes(1000) == pytest.approx(exact, rel=0.01)
    assert out.scenario.output_tokens == 1024 // 32
    assert out.scenario.hardware["h20"].decode.step_s == pytest.approx(0.025 * 0.5 * 32)


def test_lengths_rebin_exactly() -> None:
    s = load_scenario("paper-case-study")
    d = scale_lengths(s.lengths, 8)
    assert d.lo == 16 and d.hi == 131072 // 8
    assert d.mean() == pytest.approx(s.lengths.mean() / 8, rel=1e-3)


def test_pattern_follows_the_model() -> None:
    p = pattern_of(find_model("Kimi-Linear-48B-A3B"))  # 27 layers, 7 MLA: merged into 8
    assert len(p) == 8 and p.count("M") == 2 and p.endswith("M")
    assert pattern_of(find_model("Qwen3-Next-80B-A3B")) == "KKKMKKKM"  # 36 + 12 -> 6 + 2
    assert pattern_of(None) == "KKKMKKKM"


@pytest.mark.parametrize(("scales", "field"), [
    (Scales(output=3), "scales.output"),  # 1024 output tokens do not split into 3s
    (Scales(tokens=512), "scales.tokens"),  # the 128-token minimum would round to 0
    (Scales(bytes=1e-7), "scales.bytes"),  # per-token KV rounds far from the exact bytes
])
def test_scales_that_cannot_keep_the_ratios_fail(scales: Scales, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        scale_scenario(load_scenario("paper-case-study"), scales)
    assert field in str(err.value)


@pytest.mark.parametrize("raw", [{"time": 0}, {"tokens": 1.5}, {"bogus": 1}, {"bytes": -1}])
def test_bad_scale_values(raw: dict) -> None:
    with pytest.raises(ConfigError):
        Scales.from_json(raw)


def test_sliding_window_models_are_rejected() -> None:
    s = load_scenario("paper-case-study")
    with pytest.raises(ConfigError, match="sliding-window"):
        build_layout(s.kv, find_model("MiMo-V2-Flash"), 1e-3, 1)
