"""benchmarks/bench_clients.py's own logic, without the clients: the derived Mooncake trace,
the TTFT agreement with its bound and controls, and the prompt-length checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_clients as bc  # noqa: E402


def test_derived_trace_keeps_the_prefix_structure_and_rate(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    info = bc.derive_trace(bc.TRACE, out, rows=24, scale=16, max_input=2048, max_output=16,
                           rate=0.5)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    src = [json.loads(line) for line in bc.TRACE.read_text().splitlines()[:24]]
    assert len(rows) == 24 and info["block_size"] == 32
    for r, s in zip(rows, src, strict=True):
        assert r["input_length"] == min(s["input_length"] // 16, 2048)
        assert r["output_length"] == min(s["output_length"], 16)
        # every 32-token block keeps its hash id: the trace's prefix sharing survives
        assert r["hash_ids"] == s["hash_ids"][:len(r["hash_ids"])]
        assert (len(r["hash_ids"]) - 1) * 32 < r["input_length"] <= len(r["hash_ids"]) * 32
    times = [r["timestamp"] for r in rows]
    assert times == sorted(times) and len(set(times)) == 24  # buckets spread, no bursts
    assert 24 / (times[-1] / 1000) == pytest.approx(0.5, rel=0.1)


def _pairs(client: list[float], router: list[float]) -> list[tuple[dict[str, Any],
                                                                   dict[str, Any]]]:
    return [({"ttft_s": c}, {"first_text_s": r}) for c, r in zip(client, router, strict=True)]


def test_agreement_bound_and_its_controls() -> None:
    router_ttft = [0.2 + 0.05 * i for i in range(20)]
    itl = 0.015  # bound: half of it, 7.5 ms
    router = {"itl_p50_s": itl}
    close = bc.agreement(_pairs([t + 0.002 for t in router_ttft], router_ttft),
                         "first_text_s", {}, router)
    assert close["within_bound"] and close["bound_s"]["above_s"] == pytest.approx(itl / 2)
    assert close["control_late_caught"] and close["control_early_caught"]
    # negative control: a client that counts the second token as the first is caught
    late = bc.agreement(_pairs([t + itl for t in router_ttft], router_ttft), "first_text_s",
                        {}, router)
    assert not late["within_bound"]
    # and a client earlier than the router (impossible on one host) beyond the slack
    early = bc.agreement(_pairs([t - 0.02 for t in router_ttft], router_ttft),
                         "first_text_s", {}, router)
    assert not early["within_bound"]
    # a slow decode does not widen the bound past 100 ms
    assert bc.bound(1.0) == {"below_s": 0.01, "above_s": 0.10}


def test_prompt_checks_catch_other_counts() -> None:
    entries = [{"status": 200, "prompt_tokens": 100 + 25}, {"status": 200,
                                                            "prompt_tokens": 300 + 25}]
    pairs = [({"prompt_tokens": 100}, entries[0]), ({"prompt_tokens": 300}, entries[1])]
    assert bc.prompt_check("aiperf", pairs, entries, 25, bc.QUICK)["ok"]
    # a client that counted with another tokenizer (here: 4 bytes per token)
    off = [({"prompt_tokens": 25}, entries[0]), ({"prompt_tokens": 75}, entries[1])]
    assert bc.prompt_check("aiperf", off, entries, 25, bc.QUICK)["mismatches"] == 2
    # guidellm: its [min, max] = [128, 2048] prompt tokens (BOS counted) + the chat template
    inside = [{"status": 200, "prompt_tokens": n + 24} for n in (128, 2048)]
    ok = bc.prompt_check("guidellm", [], inside, 25, bc.QUICK)
    assert ok["ok"] and ok["checked"] == 2
    wide = [{"status": 200, "prompt_tokens": 4 * 2048}]
    assert not bc.prompt_check("guidellm", [], wide, 25, bc.QUICK)["ok"]
