"""benchmarks/bench_gpu_layerwise.py on the CPU at its quick sizes: it runs as shipped (its
own process, a real native deployment for the live part) and writes the schema others read
(`device`, `layerwise: [{tokens, none: {prefill_s}, naive: {prefill_s}, shipper: {prefill_s,
lag_s, bytes_equal}}]`, `profile`, `live: [{prompt_tokens, ttft_s, sim_ttft_s,
first_layer_before_prefill_end}]`). Its figures here are a schema check, not a GPU claim;
what is checked as a fact: every shipped tensor equals a direct copy (`bytes_equal`), every
live request was served on the PrfaaS route, and the profile is one the simulator read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_gpu_layerwise.py"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def test_quick_cpu_run_writes_the_schema(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((tmp_path / "gpu_layerwise.json").read_text())
    assert {"device", "layerwise", "profile", "live"} <= set(doc)
    assert doc["device"].startswith("cpu")

    assert [row["tokens"] for row in doc["layerwise"]] == [128, 256]
    for row in doc["layerwise"]:
        assert set(row) == {"tokens", "none", "naive", "shipper"}
        assert all(_number(row[m]["prefill_s"]) and row[m]["prefill_s"] > 0
                   for m in ("none", "naive", "shipper"))
        assert {"prefill_s", "lag_s", "bytes_equal"} <= set(row["shipper"])
        assert _number(row["shipper"]["lag_s"])
        assert row["shipper"]["bytes_equal"] is True

    profile = doc["profile"]
    assert [p["length_tokens"] for p in profile["prefill"]["points"]] == [64, 128, 256]
    assert [p["batch"] for p in profile["decode"]["step_points"]] == [1, 4]
    assert all(p["bytes"] > 0 for p in profile["kv"]["points"])
    assert (tmp_path / "profile.yaml").exists()

    assert [row["prompt_tokens"] for row in doc["live"]] == [192, 320, 448]
    for row in doc["live"]:
        assert {"prompt_tokens", "ttft_s", "sim_ttft_s", "first_layer_before_prefill_end"
                } <= set(row)
        assert row["ok"] and row["route"] == "prfaas", row
        assert _number(row["ttft_s"]) and row["ttft_s"] > 0
        assert _number(row["sim_ttft_s"]) and row["sim_ttft_s"] > 0
        assert isinstance(row["first_layer_before_prefill_end"], bool)
        assert row["polls"] > 0
