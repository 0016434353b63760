"""Lossless codecs on real KV for bench_transport.py: compression ratio and single-thread
compress / decompress rates of lz4 (lz4.frame, default level) and zstd (zstandard, level 1)
over 1 MiB chunks (the sender's chunk size), on the native tiny hybrid engine's KV of
one 2K-token prefill (float32, every layer's tensors as the transport ships them) and the same
KV cast to bf16 (the dtype a vLLM cache ships; vLLM's own KV was not captured: that needs a
vLLM instance run, not done here). Then what `link.compression: auto`
(policy/compression.py) would pick with these speeds for a few link rates at 4 connections.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lz4.frame
import numpy as np
import torch
import zstandard

from prfaas.engine import Engine, EngineConfig, LayerKV
from prfaas.engine.wire_adapter import layer_kv_to_arrays
from prfaas.policy.compression import CodecSpeed, choose_compression

CHUNK_BYTES = 2**20
PROMPT_TOKENS = 2048
LINK_RATES_GBPS = (0.05, 1.0, 4.0, 20.58, 100.0)  # 20.58: public-internet's path


def native_kv() -> list[np.ndarray]:
    eng = Engine(EngineConfig.tiny(threads=1))
    ids = [256, *np.random.default_rng(0).integers(0, 256, PROMPT_TOKENS - 1).tolist()]
    out: list[np.ndarray] = []

    def on_layer(kv: LayerKV) -> None:
        out.extend(a for _, a in layer_kv_to_arrays(kv))

    eng.prefill(ids, on_layer=on_layer)
    return out


def _chunks(arrays: list[np.ndarray]) -> list[bytes]:
    blob = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return [blob[i : i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)]


def _rate(fn: Callable[[], Any], nbytes: int) -> float:
    best = min(_timed(fn) for _ in range(3))
    return nbytes * 8 / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(chunks: list[bytes]) -> list[CodecSpeed]:
    raw = sum(len(c) for c in chunks)
    zc1, zd = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
    codecs: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
        "lz4": (lz4.frame.compress, lz4.frame.decompress),
        "zstd": (zc1.compress, zd.decompress),
    }
    out = []
    for name, (comp, decomp) in codecs.items():
        packed = [comp(c) for c in chunks]
        if any(decomp(p) != c for p, c in zip(packed, chunks, strict=True)):
            raise SystemExit(f"{name}: round trip differs")
        out.append(CodecSpeed(name, raw / sum(len(p) for p in packed),
                              _rate(lambda comp=comp: [comp(c) for c in chunks], raw),
                              _rate(lambda decomp=decomp, packed=packed: [decomp(p)
                                                                          for p in packed], raw)))
    return out


def figures() -> dict[str, Any]:
    kv = native_kv()
    samples = {"native_tiny_fp32": kv,
               "native_tiny_as_bf16": [torch.from_numpy(a).to(torch.bfloat16).view(torch.int16)
                                       .numpy() for a in kv]}
    result: dict[str, Any] = {"how": __doc__, "chunk_bytes": CHUNK_BYTES}
    for label, arrays in samples.items():
        chunks = _chunks(arrays)
        speeds = measure(chunks)
        result[label] = {
            "bytes": sum(len(c) for c in chunks),
            "codecs": {s.name: {"ratio": round(s.ratio, 3),
                                "compress_gbps": round(s.compress_gbps, 2),
                                "decompress_gbps": round(s.decompress_gbps, 2)} for s in speeds},
            "auto_at_4_connections": {str(r): choose_compression("auto", r, 4, tuple(speeds))
                                      for r in LINK_RATES_GBPS},
        }
        print(f"compression {label}: " + ", ".join(
            f"{s.name} x{s.ratio:.2f} {s.compress_gbps:.1f}/{s.decompress_gbps:.1f} Gbps"
            for s in speeds))
    result["vllm_llama"] = "not measured (needs a vLLM instance run)"
    return result


if __name__ == "__main__":
    import json
    print(json.dumps(figures(), indent=2))
