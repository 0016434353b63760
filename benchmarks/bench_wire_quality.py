"""What fp8 on the wire costs in quality: teacher-forced logprob error against the exact KV.

For each tiny engine preset (native torch: `tiny` = KDA:MLA 3:1, `mimo_like` = SWA:GQA 5:1,
both with their shipped weights, trained on the standard library's docstrings) and each prompt
P (held-out docstring text the models never trained on, prfaas.bench.stdlib_text; lengths across
the 64-token chunk size: shorter than a chunk, on and beside a boundary, many chunks) with its
true 32-token continuation C: prefill P once, export every layer as the prefill worker ships
it, apply one wire variant to the full-attention tensors only (linear states and SWA windows are
never encoded), import it as the decode worker does, then decode C teacher-forced: at each step the
true token is fed and the logits of the next are kept. All variants of a prompt decode in one
batch (threads=1: batched decode is bitwise batch-invariant), so the only difference between
them is the KV they imported. Variants: `exact` (the reference), `bf16`, `fp8_e4m3` (what the
wire sends: per 16-token block per head scales), `fp8_per_tensor` (one scale per tensor: a
coarser fp8) and two negative controls, `int4_per_tensor` (4-bit, one scale per tensor) and
`fp8_wrong_scale` (the wire's fp8 codes decoded with twice their scales), which must come out
clearly worse, or the measurement does not separate. Also greedy: each variant generates 32 tokens
from the same first token; the share of prompts whose continuation equals the exact one.

    PYTHONPATH=src python benchmarks/bench_wire_quality.py [--prompts 24]

Writes benchmarks/results/wire_quality.json; docs/wire-format.md renders its table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prfaas.bench.stdlib_text import heldout_windows
from prfaas.engine import Engine, EngineConfig, LayerKV
from prfaas.engine.base import DecodeSeq
from prfaas.transport.quant import (
    bf16_decode,
    bf16_encode,
    coarse_fp8_per_tensor,
    coarse_int4_per_tensor,
    fp8_dequantize,
    fp8_quantize,
)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "wire_quality.json"
CONTINUATION_TOKENS = 32
# across the 64-token chunk: inside one, on and beside boundaries, many chunks
LENGTHS = (20, 63, 64, 65, 127, 200, 511, 1000, 2047, 4000)
FULL_ATTN = ("mla", "gqa")

Variant = Callable[[np.ndarray], np.ndarray]


def _doubled(quantized: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    codes, scales = quantized
    return codes, scales * 2

VARIANTS: dict[str, Variant | None] = {
    "exact": None,
    "bf16": lambda x: bf16_decode(bf16_encode(x)),
    "fp8_e4m3": lambda x: fp8_dequantize(*fp8_quantize(x)),
    "fp8_per_tensor (control)": coarse_fp8_per_tensor,
    "int4_per_tensor (control)": coarse_int4_per_tensor,
    "fp8_wrong_scale (control)": lambda x: fp8_dequantize(*_doubled(fp8_quantize(x))),
}
PRESETS = {"tiny (KDA:MLA 3:1)": EngineConfig.tiny, "mimo_like (SWA:GQA 5:1)":
           EngineConfig.mimo_like}


def prompts(engine: Engine, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(BOS + held-out text, its true continuation) per prompt, lengths cycling LENGTHS."""
    lengths = [LENGTHS[i % len(LENGTHS)] for i in range(count)]
    spans = heldout_windows(lambda t: engine.tokenizer.encode(t, add_bos=False),
                            [n - 1 + CONTINUATION_TOKENS for n in lengths], seed)
    bos = engine.tokenizer.bos_id
    return [([bos, *s[:n - 1]], s[n - 1:]) for s, n in zip(spans, lengths, strict=True)]


def wire_layers(layers: list[LayerKV], variant: Variant | None) -> list[LayerKV]:
    if variant is None:
        return layers
    out = []
    for layer in layers:
        tensors = layer.tensors
        if layer.kind in FULL_ATTN:
            tensors = {n: torch.from_numpy(np.ascontiguousarray(variant(t.numpy())))
                       for n, t in tensors.items()}
        out.append(LayerKV(layer.layer_index, layer.kind, layer.start_token, layer.end_token,
                           tensors))
    return out


def measure_prompt(engine: Engine, prompt: list[int], cont: list[int]) -> dict[str, Any]:
    res = engine.prefill(prompt)
    exported = [res.kv.export_layer(i, 0, len(prompt)) for i in range(engine.config.num_layers)]
    names = list(VARIANTS)

    def fresh() -> list[DecodeSeq]:
        return [DecodeSeq(engine.import_kv(wire_layers(exported, VARIANTS[n]), None, prompt),
                          cont[0]) for n in names]

    forced = fresh()
    logps = []
    for j in range(1, len(cont)):
        logps.append(torch.log_softmax(engine.decode_logits(forced).double(), dim=-1))
        for seq in forced:
            seq.last_token = cont[j]
    lp = torch.stack(logps)  # [steps, variants, vocab]
    target = torch.tensor(cont[1:])
    teacher = lp[torch.arange(len(target)), :, target]  # [steps, variants]
    greedy = fresh()
    texts: list[list[int]] = [[] for _ in names]
    for _ in range(CONTINUATION_TOKENS):
        nxt = engine.decode_logits(greedy).argmax(dim=-1).tolist()
        for k, seq in enumerate(greedy):
            texts[k].append(nxt[k])
            seq.last_token = nxt[k]
    out = {}
    for k, name in enumerate(names):
        p_ref = lp[:, 0].exp()
        kl = (p_ref * (lp[:, 0] - lp[:, k])).sum(-1)
        out[name] = {
            "abs_err_teacher_logprob": (teacher[:, k] - teacher[:, 0]).abs().tolist(),
            "max_abs_err_logprob_any_token": float((lp[:, k] - lp[:, 0]).abs().max()),
            "kl_nats": kl.tolist(),
            "top1_agree": (lp[:, k].argmax(-1) == lp[:, 0].argmax(-1)).tolist(),
            "greedy_equal": texts[k] == texts[0],
        }
    return out


def summarize(per_prompt: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for name in VARIANTS:
        err = np.concatenate([p[name]["abs_err_teacher_logprob"] for p in per_prompt])
        kl = np.concatenate([p[name]["kl_nats"] for p in per_prompt])
        agree = np.concatenate([p[name]["top1_agree"] for p in per_prompt])
        out[name] = {
            "positions": int(err.size),
            "teacher_logprob_abs_err": {"mean": float(err.mean()),
                                        "p99": float(np.quantile(err, 0.99)),
                                        "max": float(err.max())},
            "max_abs_err_logprob_any_token": max(p[name]["max_abs_err_logprob_any_token"]
                                                 for p in per_prompt),
            "kl_nats_mean": float(kl.mean()),
            "top1_agreement": float(agree.mean()),
            "greedy_32_equal_fraction": float(np.mean([p[name]["greedy_equal"]
                                                       for p in per_prompt])),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    for label, make in PRESETS.items():
        engine = Engine(make(threads=1))
        cases = prompts(engine, args.prompts, args.seed)
        per_prompt = [measure_prompt(engine, p, c) for p, c in cases]
        results[label] = {"prompts": len(cases),
                          "prompt_lengths_tokens": sorted({len(p) for p, _ in cases}),
                          "variants": summarize(per_prompt)}
        print(label, json.dumps({n: v["teacher_logprob_abs_err"]
                                 for n, v in results[label]["variants"].items()}))
    OUT.write_text(json.dumps({
        "what": "teacher-forced logprob error of KV variants on the wire vs the exact KV; "
                "full-attention tensors only (linear/SWA states untouched)",
        "engine": "prfaas native torch engine, the presets' shipped weights (trained on the "
                  "stdlib's docstrings: trained_models.json), fp32 cache",
        "prompts": "held-out stdlib docstrings (prfaas.bench.stdlib_text), BOS first",
        "continuation_tokens": CONTINUATION_TOKENS, "seed": args.seed,
        "command": f"PYTHONPATH=src python benchmarks/bench_wire_quality.py --prompts "
                   f"{args.prompts}",
        "host": platform.node(), "wall_s": round(time.perf_counter() - t0, 1),
        "presets": results}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
