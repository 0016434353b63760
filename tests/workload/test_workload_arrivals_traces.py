"""Arrival processes, stratified lengths and trace readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prfaas.core.errors import ConfigError, TraceError, UnknownNameError
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.requests import stratified_lengths, synthetic
from prfaas.workload.traces import load_trace, spread_buckets

DATA = Path(__file__).resolve().parents[2] / "src" / "prfaas" / "data" / "traces"


def test_uniform_is_evenly_spaced() -> None:
    t = make_arrivals("uniform").times_s(np.random.default_rng(0), 4.0, 5)
    assert np.allclose(t, [0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize(("name", "cv_lo", "cv_hi"), [("poisson", 0.9, 1.1), ("bursty", 2.0, 4.5)])
def test_random_processes_keep_the_rate(name: str, cv_lo: float, cv_hi: float) -> None:
    t = make_arrivals(name).times_s(np.random.default_rng(1), 2.0, 20000)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert cv_lo < gaps.std() / gaps.mean() < cv_hi


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
def test_bad_rate_raises(rate: float) -> None:
    with pytest.raises(ConfigError, match="rate"):
        make_arrivals("uniform").times_s(np.random.default_rng(0), rate, 3)


def test_unknown_arrival_process() -> None:
    with pytest.raises(UnknownNameError, match="arrivals='gamma'"):
        make_arrivals("gamma")


def test_stratified_lengths_match_the_distribution_closely() -> None:
    dist = truncated_lognormal(9.9, 1.0, 128, 131072)
    strat = stratified_lengths(dist, np.random.default_rng(0), 2000)
    assert strat.mean() == pytest.approx(dist.mean(), rel=0.01)
    assert np.mean(strat > 19400) == pytest.approx(dist.prob_above(19400), abs=0.002)


def test_same_seed_same_lengths_at_any_rate() -> None:
    dist = truncated_lognormal(9.9, 1.0, 128, 131072)
    a = synthetic(dist, 1024, make_arrivals("poisson"), 1.0, 100, seed=3)
    b = synthetic(dist, 1024, make_arrivals("poisson"), 2.0, 100, seed=3)
    assert np.array_equal(a.input_tokens, b.input_tokens)
    assert np.allclose(a.arrival_s, 2 * b.arrival_s)


def test_mooncake_trace_is_read_and_spread() -> None:
    w = load_trace(DATA / "mooncake_conversation_trace.jsonl")
    assert len(w) == 12031
    assert w.hash_ids is not None and len(w.hash_ids[0]) == -(-int(w.input_tokens[0]) // 512)
    assert np.all(np.diff(w.arrival_s) > 0)  # buckets spread: no two requests at one instant
    assert 3500 < w.arrival_s[-1] < 3600


def test_spread_buckets_is_even_inside_a_bucket() -> None:
    out = spread_buckets(np.array([0.0, 0.0, 0.0, 3.0, 6.0, 6.0]))
    assert np.allclose(out, [0.0, 1.0, 2.0, 3.0, 6.0, 7.5])


def test_azure_trace_and_rescale() -> None:
    w = load_trace(DATA / "azure_llm_code_2023.csv")
    assert len(w) > 8000 and w.input_tokens.max() < 8192
    fast = w.rescaled(10.0)
    assert fast.offered_rps() == pytest.approx(10.0)
    assert np.array_equal(fast.input_tokens, w.input_tokens)


def test_missing_trace_file() -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace("/nonexistent/trace.jsonl")


def test_malformed_jsonl_names_its_line(tmp_path: Path) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]})
    path = tmp_path / "t.jsonl"
    path.write_text(f"{good}\n{good}\n{{not json\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:3: not valid JSON"):
        load_trace(path)
    path.write_text(f"{good}\n" + json.dumps({"timestamp": 1, "input_length": -4,
                                               "output_length": 5}) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: input_length=-4"):
        load_trace(path)


def test_malformed_azure_row(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.97,10,2\n2023-11-16 18:17:04.1,x,2\n")
    with pytest.raises(TraceError, match=r"a\.csv:3"):
        load_trace(path)
