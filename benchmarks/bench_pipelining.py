"""Layer-wise pipelining benchmark: prefill on the real engine while its KV streams out.

Patterns: the engine's default (12 layers, KKKM x3: the headline), the former 8-layer default
(whose layer-granular bound is above 1.25x, reported as a miss) and 32 layers. For each one:
measure the standalone prefill time T and the KV bytes B, set the token-bucket rate R = B / T
(transfer time ≈ prefill time), then alternate two modes on one persistent 4-connection link
to a receiver in a child process:
  - after:     prefill (hook only collects arrays), then send every layer, then END;
  - pipelined: `transport.stream_prefill`: prefill in a worker thread (torch releases the
               GIL); its per-layer hook hands the arrays to the event loop
               (call_soon_threadsafe), which sends layer i while layer i+1 computes.
Reported per mode: time from prefill start to the receiver's "all KV received" (monotonic
clock, shared by both processes on Linux) over T (standalone median) and over the prefill time
of that same run; content checked by crc32 digest. An ideal-link model (serial link at R, layer
i leaves when it is ready) gives the bound each mode can reach with these per-layer sizes.

"Ready" is when the engine's `on_layer` hook fires: for a full-attention (MLA) layer right
after its KV projections, before its attention and MLP (the engine emits KV as soon as it is
final); for a KDA layer when the layer is done. With a serial link at R = B / T the finish time
is at least max_i(ready_i + bytes of layers >= i / R); `bound` reports that maximum over T and
the layer that attains it (the binding layer), which is what limits layer-granular streaming.
Writes benchmarks/results/pipelining.json.

    .venv/bin/python benchmarks/bench_pipelining.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.core.units import bytes_per_s_to_gbps
from prfaas.engine import Engine, EngineConfig
from prfaas.engine.kv import LayerKV
from prfaas.engine.wire_adapter import layer_kv_to_arrays
from prfaas.transport import KVSender, LayerSink, SenderConfig, stream_prefill
from prfaas.transport.process import ReceiverProcess, digest_arrays
from prfaas.transport.wire import HEADER_BYTES

RESULT = Path(__file__).parent / "results" / "pipelining.json"
CHUNK_BYTES = 64 * 1024
Layer = tuple[int, str, list[tuple[str, np.ndarray]]]
# Same benchmark, engine hook at layer end (before early KV emission), commit 0f1514b's JSON.
PREVIOUS_HOOK_AT_LAYER_END = {
    "KKKMKKKM": {"pipelined": 1.366, "after": 2.0044, "ideal_pipelined": 1.426},
    "KKKM" * 8: {"pipelined": 1.0818, "after": 1.8656, "ideal_pipelined": 1.107}}
# Early KV emission, when the default was 8 layers, commit 5b3ab4a's JSON (another load).
PREVIOUS_8_LAYER_DEFAULT = {
    "KKKMKKKM": {"pipelined": 1.2797, "after": 1.948, "bound": 1.2986},
    "KKKM" * 8: {"pipelined": 1.0507, "after": 1.8822, "bound": 1.0764}}
# Why the 8-layer row misses 1.25x: its two MLA layers hold ~95% of the bytes; the first is
# ready at ~30-35% of the prefill and the last (~43% of the bytes) at ~80%, so even an ideal
# serial link at R = B / T finishes at >= max(0.30-0.35 + 0.95, 0.80 + 0.45) = 1.25-1.30 T
# (which term binds depends on the run's per-layer timing). Whole-layer streaming cannot beat it.
DEPTH_NOTES = {
    12: "the default (EngineConfig.tiny()): the Must-show headline",
    8: "the former default; misses the 1.25x target: its layer-granular bound "
       "(pipelined_bound_at_layer_granularity) is itself 1.25-1.30x",
    32: "KDA:MLA 3:1 at a depth closer to real models; the last layer holds a small share"}


def _prefill(engine: Engine, ids: list[int], hook: Callable[[LayerKV], None]
             ) -> tuple[float, list[float]]:
    """Run one prefill; returns its end time and each layer's ready time (monotonic s)."""
    ready: list[float] = []

    def on_layer(layer_kv: LayerKV) -> None:
        ready.append(time.monotonic())
        hook(layer_kv)

    engine.prefill(ids, on_layer=on_layer)
    return time.monotonic(), ready


def _wire_bytes(arrays: list[tuple[str, np.ndarray]]) -> int:
    return sum(a.nbytes + HEADER_BYTES * max(1, -(-a.nbytes // CHUNK_BYTES)) for _, a in arrays)


def profile(engine: Engine, ids: list[int], repeats: int) -> dict[str, Any]:
    """Standalone prefill time and per-layer (ready offset, wire bytes)."""
    runs = []
    for _ in range(repeats + 1):  # the first run warms torch up and is dropped
        sizes: list[int] = []

        def measure(kv: LayerKV, sizes: list[int] = sizes) -> None:
            sizes.append(_wire_bytes(layer_kv_to_arrays(kv)))

        start_s = time.monotonic()
        end_s, ready = _prefill(engine, ids, measure)
        runs.append((end_s - start_s, [r - start_s for r in ready], sizes))
    runs = sorted(runs[1:], key=lambda r: r[0])
    prefill_s, ready_s, sizes = runs[len(runs) // 2]
    return {"prefill_s": prefill_s, "prefill_s_runs": [round(r[0], 4) for r in runs],
            "layer_ready_s": ready_s, "layer_wire_bytes": sizes}


def bound(ready_s: list[float], sizes: list[int], prefill_s: float) -> dict[str, Any]:
    """max_i(ready_i + bytes_{>=i} / R) / T at R = B / T, and the layer i that attains it."""
    total = sum(sizes)
    terms = [ready / prefill_s + sum(sizes[i:]) / total for i, ready in enumerate(ready_s)]
    worst = max(range(len(terms)), key=terms.__getitem__)
    return {"over_prefill": round(terms[worst], 4), "binding_layer": worst,
            "binding_layer_ready_over_prefill": round(ready_s[worst] / prefill_s, 4),
            "byte_share_from_binding_layer": round(sum(sizes[worst:]) / total, 4)}


def ideal_finish_s(ready_s: list[float], sizes: list[int], rate: float, pipelined: bool
                   ) -> float:
    """Serial link at `rate` bytes/s; a layer leaves when ready (pipelined) or at the end."""
    link_free_s = 0.0
    for ready, size in zip(ready_s, sizes, strict=True):
        leave_s = ready if pipelined else ready_s[-1]
        link_free_s = max(link_free_s, leave_s) + size / rate
    return link_free_s


async def run_mode(engine: Engine, ids: list[int], tx: KVSender, rx: ReceiverProcess, rid: int,
                   pipelined: bool, rate: float) -> dict[str, float]:
    """One prefill + transfer. Pipelined goes through `stream_prefill` (the library's bridge
    from the compute thread's hook to the sender); "after" sends once the prefill returned."""
    loop = asyncio.get_running_loop()
    layers: list[Layer] = []  # appended from the prefill thread, read after it returned

    def compute(sink: LayerSink) -> tuple[float, list[float]]:
        def hook(kv: LayerKV) -> None:
            layers.append((kv.layer_index, kv.kind, layer_kv_to_arrays(kv)))
            sink(*layers[-1])

        return _prefill(engine, ids, hook)

    rx.expect(rid, timeout_s=600)
    start_s = time.monotonic()
    if pipelined:
        prefill_end_s, ready = await stream_prefill(tx, rid, compute)
    else:
        prefill_end_s, ready = await loop.run_in_executor(None, compute, lambda *_: None)
        for layer, kind, arrays in layers:
            for name, array in arrays:
                await tx.send_array(rid, layer, kind, name, array)
        await tx.finish(rid)
    done = await loop.run_in_executor(None, rx.result, 600.0)
    sent = [(layer, name, a) for layer, _kind, arrays in layers for name, a in arrays]
    if done.digest != digest_arrays(sent):
        raise SystemExit(f"request {rid}: received KV differs from the engine's")
    prefill_s = prefill_end_s - start_s
    sizes = [_wire_bytes(arrays) for _layer, _kind, arrays in layers]
    ideal_s = ideal_finish_s([r - start_s for r in ready], sizes, rate, pipelined)
    return {"total_s": done.complete_s - start_s, "prefill_s": prefill_s,
            "total_over_prefill": (done.complete_s - start_s) / prefill_s,
            "ideal_over_prefill": ideal_s / prefill_s,
            "transfer_over_prefill": sum(sizes) / rate / prefill_s, "kv_bytes": done.num_bytes}


async def bench_pattern(pattern: str, tokens: int, repeats: int, rx: ReceiverProcess,
                        first_rid: int) -> dict[str, Any]:
    engine = Engine(EngineConfig.tiny(layer_pattern=pattern, weights="seed"))  # timing only
    ids = [int(t) for t in np.random.default_rng(7).integers(0, 256, tokens)]
    prof = await asyncio.get_running_loop().run_in_executor(None, profile, engine, ids, 3)
    total_bytes = sum(prof["layer_wire_bytes"])
    rate = total_bytes / prof["prefill_s"]
    cfg = SenderConfig(num_connections=4, chunk_bytes=CHUNK_BYTES,
                       rate_gbps=bytes_per_s_to_gbps(rate), burst_bytes=CHUNK_BYTES + 256)
    modes: dict[str, list[dict[str, float]]] = {"after": [], "pipelined": []}
    async with KVSender("127.0.0.1", rx.port, cfg) as tx:
        for i in range(repeats):
            for j, mode in enumerate(modes):
                rid = first_rid + 2 * i + j
                modes[mode].append(await run_mode(engine, ids, tx, rx, rid, mode == "pipelined",
                                                  rate))
    return {
        "layer_pattern": pattern, "num_layers": len(pattern), "prompt_tokens": tokens,
        "kv_wire_bytes": total_bytes, "last_layer_byte_share":
        round(prof["layer_wire_bytes"][-1] / total_bytes, 4),
        "rate_gbps": bytes_per_s_to_gbps(rate), "standalone": prof,
        "pipelined_bound": bound(prof["layer_ready_s"], prof["layer_wire_bytes"],
                                 prof["prefill_s"]),
        "ideal_ratio": {m: round(ideal_finish_s(prof["layer_ready_s"], prof["layer_wire_bytes"],
                                                rate, m == "pipelined") / prof["prefill_s"], 4)
                        for m in modes},
        **{m: summarize(runs, prof["prefill_s"]) for m, runs in modes.items()},
    }


def summarize(runs: list[dict[str, float]], standalone_s: float) -> dict[str, Any]:
    """Medians. `total_over_prefill` uses the prefill time of the same run: other jobs share
    these cores, so prefill time drifts between runs and the standalone T is shown beside."""
    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 4)

    # The claim is conditional on transfer ≈ prefill; with prefill drifting under shared CPUs
    # only some runs meet that precondition, so they are also summarised on their own.
    near = [r["total_over_prefill"] for r in runs if 0.8 <= r["transfer_over_prefill"] <= 1.25]
    return {"total_over_prefill": med("total_over_prefill"),
            "runs_with_transfer_within_20pct_of_prefill": len(near),
            "total_over_prefill_in_those_runs": round(statistics.median(near), 4) if near
            else None,
            "ideal_over_prefill": med("ideal_over_prefill"),
            "transfer_over_prefill": med("transfer_over_prefill"),
            "total_over_standalone_prefill": round(statistics.median(
                r["total_s"] / standalone_s for r in runs), 4),
            "runs": [{k: round(v, 4) for k, v in r.items()} for r in runs]}


async def main_async(quick: bool) -> list[dict[str, Any]]:
    repeats = 2 if quick else 5
    default = EngineConfig.tiny().layer_pattern  # headline: the engine's default depth
    cases = [(default, 2048)]
    if not quick:
        cases += [("KKKM" * 2, 2048), ("KKKM" * 8, 2048)]  # see DEPTH_NOTES
    results = []
    with ReceiverProcess() as rx:
        for k, (pattern, tokens) in enumerate(cases):
            row = await bench_pattern(pattern, tokens, repeats, rx, 1000 * (k + 1))
            results.append(row)
            print(f"{pattern} ({len(pattern)} layers): pipelined "
                  f"{row['pipelined']['total_over_prefill']}x (ideal "
                  f"{row['pipelined']['ideal_over_prefill']}), after "
                  f"{row['after']['total_over_prefill']}x (ideal "
                  f"{row['after']['ideal_over_prefill']})")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the default pattern only, two repeats")
    args = parser.parse_args()
    results = asyncio.run(main_async(args.quick))
    out = {
        "benchmark": "pipelining", "how": __doc__, "chunk_bytes": CHUNK_BYTES,
        "must_show": {
            "target": "with transfer ≈ prefill: pipelined <= 1.25 x prefill time; after ≈ 2 x",
            **{f"{r['layer_pattern']} ({r['num_layers']} layers)": {
                "pipelined_total_over_prefill": r["pipelined"]["total_over_prefill"],
                "after_total_over_prefill": r["after"]["total_over_prefill"],
                "pipelined_ideal_link_over_prefill": r["pipelined"]["ideal_over_prefill"],
                # Concurrent sending competes for the shared cores and slows the prefill itself;
                # over the standalone prefill time that cost is charged too.
                "pipelined_total_over_standalone_prefill": r["pipelined"][
                    "total_over_standalone_prefill"],
                "after_total_over_standalone_prefill": r["after"]["total_over_standalone_prefill"],
                "transfer_over_prefill_median": r["pipelined"]["transfer_over_prefill"],
                "pipelined_when_transfer_within_20pct": r["pipelined"][
                    "total_over_prefill_in_those_runs"],
                "after_when_transfer_within_20pct": r["after"]["total_over_prefill_in_those_runs"],
                "last_layer_byte_share": r["last_layer_byte_share"],
                "pipelined_bound_at_layer_granularity": r["pipelined_bound"],
                "met": r["pipelined"]["total_over_prefill"] <= 1.25,
                "why_this_depth": DEPTH_NOTES.get(r["num_layers"], ""),
            } for r in results},
        },
        "before_early_kv_emission": PREVIOUS_HOOK_AT_LAYER_END,
        "early_kv_emission_8_layer_default": PREVIOUS_8_LAYER_DEFAULT,
        "results": results,
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                 "platform": platform.platform(), "loadavg_1_5_15_at_end": os.getloadavg(),
                 "note": "2 cores shared with other jobs"},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
