"""Is the payload checksum what keeps prfaas plaintext under 0.8 of a plain socket?

Why: issue 23's `as_used` plaintext figures (bench_transport.py) stayed at 0.64-0.85 of a
plain socket at 4 and 8 connections; stop 31's profile put the two CPUs 98% busy, ISA-L CRC
13% of that. This probe runs bench_transport's plaintext transfer (256 MiB of 8 MiB layer
tensors, the decode worker's receiver: arena, pages mapped at start) in four variants,
interleaved with the plain-socket baseline in every repeat, at 4 and 8 connections:
- `crc_both`: as shipped (the sender's writer thread computes each 4 MiB chunk's CRC-32 before
  its header leaves; the receiver's payload thread checks it after the payload lands);
- `sender_only`: the sender as shipped, the receiver's check skipped;
- `none`: no CRC on either side (both compute nothing and the header carries 0);
- `sender_sliced`: the sender's CRC computed per 256 KiB slice just before that slice is sent
  (the data hot in cache for the kernel's copy, as a CRC trailer after the payload would
  allow), the receiver's check skipped: compare with `sender_only`.
The variants other than `crc_both` are diagnostics patched in for this probe only (the
receiver's child process gets them from a sitecustomize in a temp dir on its PYTHONPATH);
nothing here changes the shipped path. Reads: each variant's median goodput over the plain
socket's median in the same block. Writes JSON (default
benchmarks/results/transport_checksum.json). Run it under the heavy lock (~2 min).

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/probe_transport_checksum.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import prfaas.transport.channel as channel
import prfaas.transport.sender as sender
import prfaas.transport.wire as wire
from bench_transport import AS_USED, _layers, _transfer
from prfaas.core.units import MIB
from prfaas.transport import SenderConfig
from prfaas.transport.process import ReceiverProcess
from transport_baselines import Baseline

SIZE = 256 * MIB
SLICE = 256 * 1024
VARIANTS = ("crc_both", "sender_only", "none", "sender_sliced")
# The receiver child's side of each variant: skip the check (the header's CRC read as 0 and
# the payload's computed as 0), or compute nothing where the sender sends 0.
SITECUSTOMIZE = '''
import os
_mode = os.environ.get("PRFAAS_PROBE_RX_CHECKSUM")
if _mode in ("skip", "none"):
    import dataclasses
    import prfaas.transport.receiver as _r
    _decode = _r.decode_header
    def _decode_zeroed(raw, limits):
        return dataclasses.replace(_decode(raw, limits), payload_crc=0)
    _r.decode_header = _decode_zeroed
    _r.payload_checksum = lambda data: 0
'''


def _receiver(site: str, mode: str) -> ReceiverProcess:
    """A receiver child whose checksum check is `mode` (as shipped: "check")."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PRFAAS_PROBE_RX_CHECKSUM")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, saved["PYTHONPATH"]) if p)
    os.environ["PRFAAS_PROBE_RX_CHECKSUM"] = mode
    try:
        rx = ReceiverProcess(AS_USED)
        rx.__enter__()
        return rx
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sender_patches() -> dict[str, Callable[[], None]]:
    """Set the parent's (sender's) side of each variant."""
    shipped_parts, shipped_send = sender._Frame.parts, channel.Channel.send_parts_sync

    def parts_unsealed(self: Any) -> list[Any]:  # the header with CRC 0, nothing computed
        h = self.header
        return [h if isinstance(h, bytes) else wire.encode_header(h, 0), self.payload]

    def send_sliced(self: Any, parts: list[Any], timeout_s: float) -> None:
        shipped_send(self, parts[:1], timeout_s)
        view, crc = memoryview(parts[1]).cast("B") if len(parts) > 1 else memoryview(b""), 0
        for off in range(0, len(view), SLICE):
            piece = view[off:off + SLICE]
            crc = wire.isal_zlib.crc32(piece, crc)
            while piece:
                piece = piece[self.sock.send(piece):]

    def use(parts: Any, send: Any) -> Callable[[], None]:
        def apply() -> None:
            sender._Frame.parts, channel.Channel.send_parts_sync = parts, send
        return apply

    return {"crc_both": use(shipped_parts, shipped_send),
            "sender_only": use(shipped_parts, shipped_send),
            "none": use(parts_unsealed, shipped_send),
            "sender_sliced": use(parts_unsealed, send_sliced)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "transport_checksum.json"))
    args = parser.parse_args()
    buf = np.random.default_rng(0).integers(0, 255, size=SIZE, dtype=np.uint8)
    layers = _layers(buf, SIZE)
    site = tempfile.mkdtemp(prefix="prfaas-probe-site-")
    Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
    plain = Baseline(SIZE)
    patch = _sender_patches()
    load = [os.getloadavg()[0]]
    rxs: dict[str, ReceiverProcess] = {}
    rows: list[dict[str, Any]] = []
    try:
        rx_mode = {"crc_both": "check", "sender_only": "skip", "none": "none",
                   "sender_sliced": "skip"}
        for variant in VARIANTS:
            rxs[variant] = _receiver(site, rx_mode[variant])
        rid = 0
        for variant in VARIANTS:  # warm-up
            patch[variant]()
            for _ in range(2):
                rid += 1
                asyncio.run(_transfer(rxs[variant].port, rxs[variant], rid, SenderConfig(),
                                      layers))
        for n in (4, 8):
            runs: dict[str, list[float]] = {k: [] for k in ("plain_socket", *VARIANTS)}
            for _ in range(args.repeats):
                runs["plain_socket"].append(plain.run(buf, n))
                for variant in VARIANTS:
                    patch[variant]()
                    rid += 1
                    rx = rxs[variant]
                    runs[variant].append(asyncio.run(_transfer(
                        rx.port, rx, rid, SenderConfig(num_connections=n), layers))
                        ["goodput_gbps"])
            base = statistics.median(runs["plain_socket"])
            row = {"connections": n,
                   "over_plain_socket": {v: round(statistics.median(runs[v]) / base, 3)
                                         for v in VARIANTS},
                   "goodput_gbps_runs": {k: [round(g, 2) for g in v] for k, v in runs.items()}}
            rows.append(row)
            print(n, row["over_plain_socket"], flush=True)
    finally:
        patch["crc_both"]()
        plain.close()
        for rx in rxs.values():
            rx.__exit__(None, None, None)
        shutil.rmtree(site, ignore_errors=True)
    load.append(os.getloadavg()[0])
    doc = {"tensor_bytes": SIZE, "layer_bytes": 8 * MIB, "chunk_bytes": 4 * MIB,
           "slice_bytes": SLICE, "repeats": args.repeats, "rows": rows,
           "loadavg_1m_before_after": [round(x, 2) for x in load],
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
