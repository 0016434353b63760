"""Metrics of a finished run, as plain JSON-ready numbers.

- throughput_rps: completions inside the steady window [first arrival + span/4, last arrival]
  divided by its length (the first quarter is warm-up; counting to the last arrival keeps the
  decode time of the last requests out of the denominator).
- ttft_s: arrival to KV (and first token) at the decoder = queue + prefill + transfer.
- tpot_s: (finish - TTFT end) / (output_tokens - 1): decode steps plus any wait for a slot.
- egress_gbps: inter-cluster bytes per 1 s window; each transfer's bytes are spread evenly from
  when it joined the link to when it completed (a pipelined transfer is paced by its prefill,
  so this is what the link carries when it is not saturated).
- utilization: busy time / instance-seconds in the role (a rebalanced instance counts in each
  role only while it held it).
- spilled / queue_full (only with `max_queued_per_prefill`): requests the spill moved to the
  other route, and those refused with both routes full (counted in `rejected` too).
- queue_growth: mean number of requests in the system seen by arrivals in the last quarter of
  the run minus the same in the second quarter (> 0 when a queue keeps growing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.link import BYTES_PER_GBPS
from prfaas.sim.simulator import Simulator

FloatArray = np.ndarray


def _stats(values: FloatArray, keys: tuple[str, ...]) -> dict[str, float | None]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return dict.fromkeys(keys)
    out: dict[str, float | None] = {}
    for key in keys:
        v = float(finite.mean()) if key == "mean" else float(np.percentile(finite, int(key[1:])))
        out[key] = round(v, 6)
    return out


def egress_windows(sim: Simulator, window_s: float = 1.0) -> FloatArray:
    """Inter-cluster egress (Gbps) in consecutive windows from t = 0."""
    log = sim.log
    start = np.asarray(log.flow_start_s)
    end = np.asarray(log.kv_ready_s)
    size = np.asarray(log.kv_bytes)
    ok = np.isfinite(start) & np.isfinite(end)
    start, end, size = start[ok], end[ok], size[ok]
    horizon = max(sim.now_s, float(end.max()) if end.size else 0.0)
    edges = np.arange(0.0, horizon + window_s, window_s)
    if start.size == 0:
        return np.zeros(max(edges.size - 1, 0))
    dur = np.maximum(end - start, 1e-9)
    rate = size / dur
    # cumulative bytes B(x) = sum rate_i * clip(x - s_i, 0, d_i): piecewise linear in x
    points = np.concatenate([start, end])
    slope_delta = np.concatenate([rate, -rate])
    order = np.argsort(points, kind="stable")
    points, slope_delta = points[order], slope_delta[order]
    slope = np.cumsum(slope_delta)
    cum = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(points))])
    sent = np.interp(edges, points, cum, left=0.0, right=float(cum[-1]))
    return np.diff(sent) / window_s / BYTES_PER_GBPS


def _role_s(pool: Sequence[PrefillInstance | DecodeInstance], end_s: float) -> float:
    """Instance-seconds the pool served in its role (instances the rebalancer moved count
    only while they held the role)."""
    if all(i.start_s == 0.0 and i.end_s is None for i in pool):
        return len(pool) * end_s  # no role changes: the plain figure, bit for bit
    return sum((end_s if i.end_s is None else i.end_s) - i.start_s for i in pool)


def summarize(sim: Simulator) -> dict[str, Any]:
    log = sim.log
    arrival = np.asarray(log.arrival_s)
    ready = np.asarray(log.kv_ready_s)
    finish = np.asarray(log.finish_s)
    outputs = np.asarray(log.output_tokens, dtype=float)
    n = arrival.size
    first, last = (float(arrival[0]), float(arrival[-1])) if n else (0.0, 0.0)
    span = last - first
    lo = first + span / 4
    completed = int(np.isfinite(finish).sum())
    in_window = int(((finish >= lo) & (finish <= last)).sum())
    throughput = in_window / (last - lo) if last > lo else float("nan")
    ttft = ready - arrival
    tpot = (finish - ready) / np.maximum(outputs - 1, 1)
    egress = egress_windows(sim)
    busy_end = max(sim.now_s, 1e-9)
    prefill_util = {c: round(sum(p.busy_s for p in pool) / _role_s(pool, busy_end), 4)
                    for c, pool in (("prfaas_prefill", sim.remote), ("pd_prefill", sim.local))
                    if pool}
    decode_slots_s = sum(d.bs_max for d in sim.decoders) * busy_end \
        if len(sim.decoders) * busy_end == _role_s(sim.decoders, busy_end) \
        else sim.decoders[0].bs_max * _role_s(sim.decoders, busy_end)
    decode_util = sum(d.slot_s for d in sim.decoders) / decode_slots_s
    seen = np.asarray(sim.in_system_at_arrival, dtype=float)
    quarter = seen.size // 4
    growth = float(seen[3 * quarter:].mean() - seen[quarter:2 * quarter].mean()) \
        if quarter else 0.0
    thresholds = np.asarray(log.threshold_tokens)
    spill = {"spilled": sim.spilled, "queue_full": sim.queue_full} \
        if sim.cfg.max_queued_per_prefill is not None else {}
    return {
        "system": sim.cfg.system,
        "offered_rps": round((n - 1) / span, 6) if span > 0 else None,
        "throughput_rps": round(throughput, 6) if np.isfinite(throughput) else None,
        "completed": completed,
        "rejected": int(np.sum(log.rejected)),
        **spill,
        "requests": n,
        "ttft_s": _stats(ttft, ("mean", "p50", "p90", "p99")),
        "tpot_s": _stats(tpot, ("mean", "p90")),
        "e2e_s": _stats(finish - arrival, ("mean", "p50", "p99")),
        "offload_fraction": round(float(np.mean(log.remote)), 6) if n else None,
        "egress_gbps": {"mean": round(float(egress.mean()), 6) if egress.size else 0.0,
                        "p99": round(float(np.percentile(egress, 99)), 6) if egress.size
                        else 0.0},
        "utilization": {**prefill_util, "pd_decode": round(decode_util, 4),
                        "link": round(sim.link.bytes_sent / BYTES_PER_GBPS / busy_end
                                      / max(sim.cfg.link.gbps), 4)},
        "queue": {"in_system_mean": round(float(seen.mean()), 3) if seen.size else 0.0,
                  "in_system_max": int(seen.max()) if seen.size else 0,
                  "growth": round(growth, 3)},
        "threshold_tokens": {"first": int(thresholds[0]) if n else None,
                             "last": int(thresholds[-1]) if n else None},
        "events": sim.events,
        "simulated_s": round(sim.now_s, 6),
    }


REQUEST_COLUMNS = ("id", "arrival_s", "input_tokens", "output_tokens", "remote", "rejected",
                   "threshold_tokens", "prefill_start_s", "prefill_end_s", "kv_ready_s",
                   "finish_s")


def request_table(sim: Simulator) -> Iterator[tuple[Any, ...]]:
    """One tuple per request, in `REQUEST_COLUMNS` order (for the CSV; read lazily, no
    per-request dict: a 10,000-GPU hour has a million rows)."""
    log = sim.log
    return zip(range(len(log.arrival_s)), log.arrival_s, log.input_tokens, log.output_tokens,
               map(int, log.remote), map(int, log.rejected), log.threshold_tokens,
               log.prefill_start_s, log.prefill_end_s, log.kv_ready_s, log.finish_s,
               strict=True)


def per_request_rows(sim: Simulator) -> list[dict[str, Any]]:
    """One row per request, as dicts keyed by `REQUEST_COLUMNS`."""
    return [dict(zip(REQUEST_COLUMNS, row, strict=True)) for row in request_table(sim)]
