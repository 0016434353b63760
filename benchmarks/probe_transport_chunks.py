"""Would another chunk size or in-flight cap bring prfaas plaintext to 0.8 of a plain socket?

Why: issue 23's `as_used` plaintext figures (bench_transport.py) stayed at 0.64-0.85 of a
plain socket at 4 and 8 connections, and its per-connection shares at 8 connections were
uneven (0.09-0.17 of the bytes where 0.125 is even): with 4 MiB chunks a connection that
holds one chunk more than another at the end makes the transfer wait for it. This probe runs
the same 256 MiB transfer (8 MiB layer tensors, the decode worker's receiver: arena, pages
mapped at start) with chunks of 1, 2 and 4 MiB and in-flight caps of 16, 32 and 64 MiB (the
default: 4 MiB, 64 MiB), interleaved with the plain-socket baseline in every repeat, at 4 and
8 connections. Reads: each variant's median goodput over the plain socket's median in the
same block, and the median largest connection share. Writes JSON (default
benchmarks/results/transport_chunks.json). Run it under the heavy lock (~2 min).

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/probe_transport_chunks.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench_transport import AS_USED, _layers, _transfer
from prfaas.core.units import MIB
from prfaas.transport import SenderConfig
from prfaas.transport.process import ReceiverProcess
from transport_baselines import Baseline

SIZE = 256 * MIB
VARIANTS = ((1, 64), (2, 64), (4, 64), (1, 16), (4, 32))  # (chunk MiB, in-flight MiB)


def range_by_connections(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """[lowest, highest] over_plain_socket of the variants at each connection count."""
    out: dict[str, list[float]] = {}
    for n in sorted({r["connections"] for r in rows}):
        ratios = [r["over_plain_socket"] for r in rows if r["connections"] == n]
        out[str(n)] = [min(ratios), max(ratios)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "transport_chunks.json"))
    args = parser.parse_args()
    buf = np.random.default_rng(0).integers(0, 255, size=SIZE, dtype=np.uint8)
    layers = _layers(buf, SIZE)
    plain = Baseline(SIZE)
    load = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    try:
        with ReceiverProcess(AS_USED) as rx:
            rid = 0
            for rid in (1, 2):  # warm-up
                asyncio.run(_transfer(rx.port, rx, rid, SenderConfig(), layers))
            for n in (4, 8):
                plain_gbps: list[float] = []
                runs: dict[tuple[int, int], list[dict[str, Any]]] = {v: [] for v in VARIANTS}
                for _ in range(args.repeats):
                    plain_gbps.append(plain.run(buf, n))
                    for chunk, inflight in VARIANTS:
                        rid += 1
                        cfg = SenderConfig(num_connections=n, chunk_bytes=chunk * MIB,
                                           max_inflight_bytes=inflight * MIB)
                        runs[(chunk, inflight)].append(
                            asyncio.run(_transfer(rx.port, rx, rid, cfg, layers)))
                base = statistics.median(plain_gbps)
                for (chunk, inflight), rs in runs.items():
                    gbps = [r["goodput_gbps"] for r in rs]
                    rows.append({
                        "connections": n, "chunk_mib": chunk, "inflight_mib": inflight,
                        "over_plain_socket": round(statistics.median(gbps) / base, 3),
                        "goodput_gbps_runs": [round(g, 2) for g in gbps],
                        "plain_socket_gbps_runs": [round(g, 2) for g in plain_gbps],
                        "largest_connection_share": round(statistics.median(
                            r["connection_share_min_max"][1] for r in rs), 3)})
                    print(rows[-1]["connections"], chunk, inflight,
                          rows[-1]["over_plain_socket"], rows[-1]["largest_connection_share"])
    finally:
        plain.close()
    load.append(os.getloadavg()[0])
    best = {str(n): max((r for r in rows if r["connections"] == n),
                        key=lambda r: r["over_plain_socket"]) for n in (4, 8)}
    doc = {"tensor_bytes": SIZE, "layer_bytes": 8 * MIB, "repeats": args.repeats,
           "rows": rows, "best": {n: {k: b[k] for k in ("chunk_mib", "inflight_mib",
                                                        "over_plain_socket")}
                                  for n, b in best.items()},
           "range_by_connections": range_by_connections(rows),
           "loadavg_1m_before_after": [round(x, 2) for x in load],
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["best"]))


if __name__ == "__main__":
    main()
