"""Copy the measured codec figures into the package: transport.json `compression` (written by
benchmarks/codec_figures.py) -> src/prfaas/data/codec_speeds.json, which the scenario's
`link.compression` reads (models/compression.py). Only the figures move (ratio, one-thread
compress / decompress Gbps per codec, per measured KV and its dtype on the wire); a test holds
the two files equal, so a rerun of codec_figures.py without this is caught.

    PYTHONPATH=src .venv/bin/python benchmarks/sync_codec_speeds.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRANSPORT = ROOT / "benchmarks" / "results" / "transport.json"
OUT = ROOT / "src" / "prfaas" / "data" / "codec_speeds.json"
DTYPES = ("fp8_e4m3", "bf16", "fp32")  # the suffixes codec_figures.py names its KV by
FIELDS = ("ratio", "compress_gbps", "decompress_gbps")


def table(compression: dict[str, Any]) -> dict[str, Any]:
    """{kv: {dtype: {codec: {ratio, compress_gbps, decompress_gbps}}}} from transport.json's
    `compression` object."""
    kv: dict[str, dict[str, Any]] = {}
    for key, entry in compression.items():
        if not isinstance(entry, dict) or "codecs" not in entry:
            continue
        dtype = next(d for d in DTYPES if key.endswith("_" + d))
        kv.setdefault(key[: -len(dtype) - 1], {})[dtype] = {
            name: {f: c[f] for f in FIELDS} for name, c in sorted(entry["codecs"].items())}
    return kv


def main() -> None:
    comp = json.loads(TRANSPORT.read_text())["compression"]
    OUT.write_text(json.dumps({
        "what": "lossless codec figures measured on real KV as the wire ships it: ratio "
                "(tensor / wire bytes) and one-thread compress / decompress rates in tensor "
                "Gbps, per measured KV and its dtype on the wire",
        "source": "benchmarks/results/transport.json `compression` (benchmarks/codec_figures.py,"
                  " copied by benchmarks/sync_codec_speeds.py)",
        "measured_at": comp.get("measured_at"), "chunk_bytes": comp["chunk_bytes"],
        "zstd_level": comp["zstd_level"], "kv": table(comp)}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
