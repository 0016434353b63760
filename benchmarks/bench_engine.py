"""Engine throughput against the same model without the serving bookkeeping.

Prefill tokens/s at 1K, 4K, 16K: `Engine.prefill` (block-aligned 64-token chunks, paged KV,
linear-state snapshots at every block, a per-layer hook that receives each layer's exported KV)
beside `HybridLM.forward_full` (whole-sequence projections, KDA chunkwise with no snapshots,
attention in 64-query tiles over contiguous K/V, no cache kept).
Decode tokens/s at batch 1, 8, 32 with 512 tokens of context: `Engine.decode_step` (paged
blocks gathered per sequence, per-sequence attention loop, snapshot bookkeeping) beside
`PlainDecoder.step` (equal-length batch, contiguous caches, one batched einsum per layer).
Runs alternate engine / plain so machine noise hits both; ratios come from one run.

    .venv/bin/python benchmarks/bench_engine.py [--quick]  ->  benchmarks/results/engine.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch

from prfaas.engine import DecodeSeq, Engine, EngineConfig, LayerKV
from prfaas.engine.plain import PlainDecoder
from prfaas.engine.profiler import cpu_model, median_time_s, prompt_tokens

OUT = Path(__file__).parent / "results" / "engine.json"


def bench_prefill(engine: Engine, length: int, reps: int) -> dict[str, float]:
    ids = prompt_tokens(length, seed=length)
    tensor_ids = torch.tensor(ids)
    hooked: list[int] = []

    def hook(layer: LayerKV) -> None:
        hooked.append(layer.byte_size())

    def run_engine() -> None:
        engine.prefill(ids, on_layer=hook)

    def run_plain() -> None:
        with torch.inference_mode():
            engine.model.forward_full(tensor_ids)

    engine_s, plain_s = [], []
    for _ in range(reps):  # alternate so noise on the shared machine hits both
        engine_s.append(median_time_s(run_engine, 1))
        plain_s.append(median_time_s(run_plain, 1))
    e, p = statistics.median(engine_s), statistics.median(plain_s)
    return {"length_tokens": length, "reps": reps, "engine_s": round(e, 4),
            "plain_s": round(p, 4), "engine_tokens_per_s": round(length / e, 1),
            "plain_tokens_per_s": round(length / p, 1), "engine_over_plain_time": round(e / p, 3),
            "hook_bytes_per_prefill": sum(hooked) // reps}


def bench_decode(engine: Engine, batch: int, context: int, steps: int) -> dict[str, float]:
    base = engine.prefill(prompt_tokens(context, seed=1))
    seqs = [DecodeSeq(base.kv.snapshot_at(context), base.first_token) for _ in range(batch)]
    plain = PlainDecoder(engine.model, [s.kv for s in seqs], steps + 2)
    plain_ids = torch.full((batch,), base.first_token, dtype=torch.long)
    engine.decode_step(seqs)  # warm-up both
    plain.step(plain_ids)
    engine_s, plain_s = [], []
    for _ in range(steps):
        engine_s.append(median_time_s(lambda: engine.decode_step(seqs), 1))
        plain_s.append(median_time_s(lambda: plain.step(plain_ids), 1))
    e, p = statistics.median(engine_s), statistics.median(plain_s)
    return {"batch": batch, "context_tokens": context, "steps": steps,
            "engine_step_s": round(e, 5), "plain_step_s": round(p, 5),
            "engine_tokens_per_s": round(batch / e, 1), "plain_tokens_per_s": round(batch / p, 1),
            "engine_over_plain_time": round(e / p, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1K/4K only, fewer reps (smoke)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    config = EngineConfig.tiny()
    engine = Engine(config)
    engine.prefill(prompt_tokens(256))  # warm-up
    lengths = (1024, 4096) if args.quick else (1024, 4096, 16384)
    reps = {1024: 3, 4096: 2, 16384: 1}
    prefill = []
    for n in lengths:
        prefill.append(bench_prefill(engine, n, reps[n]))
        print("prefill", prefill[-1], flush=True)
    decode = []
    for b in (1, 8, 32):
        decode.append(bench_decode(engine, b, 512, 8 if args.quick else 24))
        print("decode", decode[-1], flush=True)
    result = {
        "what": "engine prefill/decode throughput vs the same model without serving bookkeeping",
        "how": (__doc__ or "").strip().splitlines()[:10],
        "machine": {"cpu": cpu_model(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "note": "2-core VM shared with other jobs while measured: absolute times are "
                            "noisy, compare the engine/plain ratios of one run"},
        "config": {"name": config.name, "layer_pattern": config.layer_pattern,
                   "hidden": config.hidden, "num_heads": config.num_heads,
                   "head_dim": config.head_dim, "kv_lora_rank": config.kv_lora_rank,
                   "block_size_tokens": config.block_size_tokens, "seed": config.seed,
                   "threads": config.threads},
        "quick": args.quick,
        "prefill": prefill,
        "decode": decode,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
