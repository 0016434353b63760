"""Trace readers: Mooncake JSONL and Azure LLM inference CSV, into a `Workload`.

Mooncake JSONL: one JSON object per line with `timestamp` (ms), `input_length`,
`output_length`, `hash_ids` (chained 512-token prefix-block ids). The conversation trace's
timestamps are quantised to ~3 s buckets (most gaps are 0). `spread_buckets` places the k
requests sharing a timestamp evenly inside their bucket, in file order: request i of k arrives at
ts + i * width / k, where width is the gap to the next distinct timestamp (the median gap for
the last bucket). It is deterministic, keeps the order and the per-bucket counts, and turns a
train of 3 s bursts into the smooth load the original service saw.

Azure CSV: header `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like
`2023-11-16 18:17:03.9799600` (sub-microsecond digits are dropped). No prefix information.

Errors name the file and, for a malformed record, its 1-based line number (TraceError).
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from prfaas.core.errors import TraceError
from prfaas.workload.requests import FloatArray, Workload


def load_trace(path: str | Path, spread: bool = True) -> Workload:
    """Read a `.jsonl` (Mooncake) or `.csv` (Azure) trace; times start at 0 seconds."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(str(path), None, "no such trace file")
    if p.suffix not in (".jsonl", ".csv"):
        raise TraceError(str(path), None,
                         "unknown trace format; expected .jsonl (Mooncake) or .csv")
    try:
        return read_mooncake(p, spread) if p.suffix == ".jsonl" else read_azure(p)
    except UnicodeDecodeError:
        raise TraceError(str(path), None, "not a text file (not valid UTF-8)") from None


def _positive_int(value: object, key: str, path: Path, line: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(str(path), line, f"{key}={value!r}: expected an integer >= {minimum}")
    return value


def read_mooncake(path: Path, spread: bool = True) -> Workload:
    stamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as err:
                raise TraceError(str(path), lineno, f"not valid JSON ({err.msg})") from None
            if not isinstance(rec, dict):
                raise TraceError(str(path), lineno, "expected a JSON object")
            ts = rec.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
                raise TraceError(str(path), lineno, f"timestamp={ts!r}: expected ms >= 0")
            stamps.append(float(ts) / 1000.0)
            inputs.append(_positive_int(rec.get("input_length"), "input_length", path, lineno))
            outputs.append(_positive_int(rec.get("output_length"), "output_length", path, lineno))
            ids = rec.get("hash_ids", [])
            if not isinstance(ids, list):
                raise TraceError(str(path), lineno, "hash_ids: expected a list")
            hashes.append(tuple(int(h) for h in ids))
    if not stamps:
        raise TraceError(str(path), None, "trace holds no requests")
    times = np.asarray(stamps)
    if np.any(np.diff(times) < 0):
        order = np.argsort(times, kind="stable")
        times = times[order]
        inputs = [inputs[i] for i in order]
        outputs = [outputs[i] for i in order]
        hashes = [hashes[i] for i in order]
    times = spread_buckets(times) if spread else times
    return Workload(times - times[0], np.asarray(inputs, dtype=np.int64),
                    np.asarray(outputs, dtype=np.int64), f"mooncake trace {path.name}",
                    tuple(hashes))


def spread_buckets(times_s: FloatArray) -> FloatArray:
    """Spread requests that share a timestamp evenly over the gap to the next timestamp."""
    distinct, start, counts = np.unique(times_s, return_index=True, return_counts=True)
    if distinct.size < 2:
        return times_s.copy()
    gaps = np.diff(distinct)
    widths = np.append(gaps, np.median(gaps))
    rank = np.arange(times_s.size) - np.repeat(start, counts)  # position inside its bucket
    return times_s + rank * np.repeat(widths / counts, counts)


def _azure_time(text: str, path: Path, line: int) -> float:
    try:
        head, _, frac = text.strip().partition(".")
        stamp = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        return stamp.timestamp() + (float(f"0.{frac[:6]}") if frac else 0.0)
    except ValueError:
        raise TraceError(str(path), line, f"TIMESTAMP={text!r}: not YYYY-MM-DD HH:MM:SS[.f]") \
            from None


def read_azure(path: Path) -> Workload:
    stamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header is None or [h.strip() for h in header[:3]] != want:
            raise TraceError(str(path), 1, f"expected header {','.join(want)}")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) < 3:
                raise TraceError(str(path), line, f"expected 3 columns, got {len(row)}")
            stamps.append(_azure_time(row[0], path, line))
            try:
                inputs.append(int(row[1]))
                outputs.append(int(row[2]))
            except ValueError:
                raise TraceError(str(path), line, f"token counts {row[1:3]!r}: not integers") \
                    from None
            if inputs[-1] < 1 or outputs[-1] < 1:
                raise TraceError(str(path), line, f"token counts {row[1:3]!r}: must be >= 1")
    if not stamps:
        raise TraceError(str(path), None, "trace holds no requests")
    times = np.asarray(stamps)
    order = np.argsort(times, kind="stable")
    times = times[order]
    return Workload(times - times[0], np.asarray(inputs, dtype=np.int64)[order],
                    np.asarray(outputs, dtype=np.int64)[order], f"azure trace {path.name}")
