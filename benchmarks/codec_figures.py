"""Lossless codecs on real KV, as the wire uses them (transport/codec.py: lz4 block, zstd level 1,
1 MiB chunks per tensor, a chunk sent raw unless it shrinks): compression ratio and one-thread
compress / decompress rates (uncompressed Gbps, best of 5) on
- the native tiny hybrid engine (KDA:MLA 3:1): one 2K-token prefill, every tensor as the prefill
  worker ships it (serve/worker/kvship.layer_arrays) with wire dtype none (float32), bf16 and
  fp8_e4m3 (codes + scales; linear states keep float32);
- the tiny vLLM models (llama; qwen3_next, 3 Gated DeltaNet : 1 full attention) built by
  integrations/vllm/model_builder.py with the seed the vLLM tests use: their KV for one 2K-token
  prompt computed by transformers from the same weights in bf16 (what vLLM's CPU build runs),
  token-major [T, kv_heads, head_dim] as the connector ships vLLM's paged blocks, and for
  qwen3_next its GDN states (recurrent float32 as `--mamba-ssm-cache-dtype float32`, conv
  bf16). Not captured from a vLLM instance: same weights and math, its kernels may round
  differently in the last bit.
Then what `link.compression: auto` (policy/compression.py) picks with those speeds for a few link
rates at 4 connections, and end to end: the native engine's bf16 KV tiled to 64 MiB through a
KVSender into a receiver in a child process (as bench_transport.py, content checked by digest)
over a 1 Gbps token-bucket link and unshaped, compression none / zstd / auto, 4 connections:
tensor bytes per second ("goodput") and the bytes on the wire.

    PYTHONPATH=src .venv/bin/python benchmarks/codec_figures.py --update   # into transport.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prfaas.engine import Engine, EngineConfig, LayerKV
from prfaas.models.compression import CodecSpeed, choose_compression
from prfaas.serve.worker.kvship import layer_arrays
from prfaas.transport import KVSender, SenderConfig
from prfaas.transport import codec as codecs
from prfaas.transport.process import ReceiverProcess, digest_arrays
from prfaas.transport.receiver import ReceiverConfig

PROMPT_TOKENS = 2048
LINK_RATES_GBPS = (0.05, 1.0, 4.0, 20.58, 100.0)  # 20.58: public-internet's path
END_TO_END_BYTES = 64 * 2**20
END_TO_END_RATE_GBPS = 1.0
REPEATS = 3
RESULT = Path(__file__).parent / "results" / "transport.json"


def native_kv(wire_dtypes: tuple[str | None, ...]) -> dict[str | None, list[np.ndarray]]:
    """One prefill; each layer's tensors as shipped with each wire dtype."""
    eng = Engine(EngineConfig.tiny(threads=1))
    ids = [256, *np.random.default_rng(0).integers(0, 256, PROMPT_TOKENS - 1).tolist()]
    out: dict[str | None, list[np.ndarray]] = {w: [] for w in wire_dtypes}

    def on_layer(kv: LayerKV) -> None:  # encoded as the prefill worker's hook encodes it
        for w in wire_dtypes:
            out[w].extend(np.array(a) for _, a in layer_arrays(kv, w))

    eng.prefill(ids, on_layer=on_layer)
    return out


def _words(t: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as the connector ships them (bf16 as raw 2-byte words)."""
    t = t.contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def vllm_kv(arch: str) -> list[np.ndarray]:
    from transformers import AutoModelForCausalLM

    from prfaas.integrations.vllm.model_builder import build_model

    with tempfile.TemporaryDirectory(prefix=f"prfaas-codec-{arch}-") as tmp:  # removed after
        model_dir = build_model(arch, tmp, seed=0)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    ids = torch.from_numpy(np.random.default_rng(0).integers(3, 1000, (1, PROMPT_TOKENS)))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    out: list[np.ndarray] = []
    for layer in cache.layers:
        if hasattr(layer, "keys") and layer.keys is not None:  # [1, heads, T, D] -> [T, heads, D]
            out += [_words(layer.keys[0].transpose(0, 1)), _words(layer.values[0].transpose(0, 1))]
        else:  # GDN: recurrent state float32 (as served), conv state in the cache dtype
            out += [_words(s[0].float()) for s in layer.recurrent_states.values()]
            out += [_words(s[0].to(torch.bfloat16)) for s in layer.conv_states.values()]
    return out


def samples() -> dict[str, list[np.ndarray]]:
    native = native_kv((None, "bf16", "fp8_e4m3"))
    out = {f"native_tiny_{w or 'fp32'}": arrays for w, arrays in native.items()}
    for arch in ("llama", "qwen3_next"):
        out[f"vllm_tiny_{arch}_bf16"] = vllm_kv(arch)
    return out


def _row(arrays: list[np.ndarray]) -> tuple[dict[str, Any], tuple[CodecSpeed, ...]]:
    views = [np.ascontiguousarray(a).reshape(-1).view(np.uint8).data for a in arrays]
    speeds = codecs.measure(views, repeats=5)
    return {"bytes": sum(len(v) for v in views), "tensors": len(views),
            "codecs": {s.name: {"ratio": round(s.ratio, 3),
                                "compress_gbps": round(s.compress_gbps, 2),
                                "decompress_gbps": round(s.decompress_gbps, 2)} for s in speeds},
            "auto_at_4_connections": {str(r): choose_compression("auto", r, 4, speeds)
                                      for r in LINK_RATES_GBPS}}, speeds


async def _transfer(rx: ReceiverProcess, rid: int, cfg: SenderConfig,
                    layers: list[tuple[int, str, np.ndarray]]) -> dict[str, Any]:
    async with KVSender("127.0.0.1", rx.port, cfg) as tx:
        rx.expect(rid, timeout_s=300)
        start_s = time.monotonic()
        for layer, name, array in layers:
            await tx.send_array(rid, layer, "mla", name, array, bfloat16=True)
        wire = await tx.finish(rid)
        done = await asyncio.get_running_loop().run_in_executor(None, rx.result, 300.0)
        codec = tx.codec
    if done.digest != digest_arrays(layers):
        raise SystemExit(f"request {rid}: content differs after the transfer ({cfg})")
    seconds = done.complete_s - start_s
    return {"goodput_gbps": done.num_bytes * 8 / seconds / 1e9, "wire_bytes": wire,
            "tensor_bytes": done.num_bytes, "codec": codec}


def end_to_end(kv_bf16: list[np.ndarray]) -> dict[str, Any]:
    tiles, total = [], 0
    while total < END_TO_END_BYTES:
        for a in kv_bf16:  # bf16 words (full attention) and float32 states, as 2-byte words
            tiles.append((len(tiles), "kv", np.ascontiguousarray(a).reshape(-1).view(np.uint16)))
            total += a.nbytes
    out: dict[str, Any] = {"tensor_bytes": total, "connections": 4, "repeats": REPEATS}
    rid = 0
    with ReceiverProcess(ReceiverConfig(pretouch_arena=True)) as rx:
        for label, rate in (("shaped_1gbps", END_TO_END_RATE_GBPS), ("unshaped", None)):
            rows: dict[str, Any] = {}
            for mode in ("none", "zstd", "auto"):
                cfg = SenderConfig(num_connections=4, rate_gbps=rate, compression=mode)
                runs = []
                for _ in range(REPEATS + 1):  # the first one warms the connections up
                    rid += 1
                    runs.append(asyncio.run(_transfer(rx, rid, cfg, tiles)))
                runs = runs[1:]
                rows[mode] = {"goodput_gbps": round(statistics.median(
                                  r["goodput_gbps"] for r in runs), 3),
                              "goodput_gbps_runs": [round(r["goodput_gbps"], 3) for r in runs],
                              "wire_over_tensor_bytes": round(runs[0]["wire_bytes"]
                                                              / runs[0]["tensor_bytes"], 4),
                              "codec": runs[0]["codec"]}
            if rate is not None:
                for r in rows.values():
                    r["goodput_over_rate"] = round(r["goodput_gbps"] / rate, 3)
            rows["zstd_over_none"] = round(rows["zstd"]["goodput_gbps"]
                                           / rows["none"]["goodput_gbps"], 3)
            out[label] = {"rate_gbps": rate, **rows}
            print(f"end to end {label}: " + ", ".join(
                f"{m} {rows[m]['goodput_gbps']:.2f} Gbps ({rows[m]['codec']})"
                for m in ("none", "zstd", "auto")))
    return out


def figures() -> dict[str, Any]:
    kv = samples()
    result: dict[str, Any] = {"how": __doc__, "chunk_bytes": 2**20,
                              "zstd_level": codecs.ZSTD_LEVEL, "prompt_tokens": PROMPT_TOKENS,
                              "loadavg_1_5_15_at_start": os.getloadavg()}
    for label, arrays in kv.items():
        result[label], speeds = _row(arrays)
        print(f"compression {label}: " + ", ".join(
            f"{s.name} x{s.ratio:.3f} {s.compress_gbps:.1f}/{s.decompress_gbps:.1f} Gbps"
            for s in speeds))
    result["end_to_end_native_bf16"] = end_to_end(kv["native_tiny_bf16"])
    result["loadavg_1_5_15_at_end"] = os.getloadavg()
    return result


def as_used_summary(c: dict[str, Any]) -> dict[str, Any]:
    """The compression figures issue 23 item 7 asks for in transport.json's `as_used`."""
    e2e = c["end_to_end_native_bf16"]
    return {k: {"zstd_ratio": c[k]["codecs"]["zstd"]["ratio"],
                "lz4_ratio": c[k]["codecs"]["lz4"]["ratio"],
                "zstd_compress_gbps": c[k]["codecs"]["zstd"]["compress_gbps"],
                "zstd_decompress_gbps": c[k]["codecs"]["zstd"]["decompress_gbps"]}
            for k in c if k.startswith(("native_", "vllm_"))} | {
        "shaped_1gbps_zstd_over_none": e2e["shaped_1gbps"]["zstd_over_none"],
        "unshaped_zstd_over_none": e2e["unshaped"]["zstd_over_none"],
        "auto_picked": {"shaped_1gbps": e2e["shaped_1gbps"]["auto"]["codec"],
                        "unshaped": e2e["unshaped"]["auto"]["codec"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true",
                        help=f"write the figures into {RESULT} (its `compression` and "
                             "`as_used.compression`), leaving its other figures as they are")
    args = parser.parse_args()
    figs = figures()
    if not args.update:
        print(json.dumps(figs, indent=2))
        return
    result = json.loads(RESULT.read_text())
    result["compression"] = figs
    result["compression"]["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["as_used"]["compression"] = as_used_summary(figs)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"updated {RESULT}: compression, as_used.compression")


if __name__ == "__main__":
    main()
