"""What fp8 on the wire costs on vLLM: teacher-forced logprob error against the cache dtype (bf16).

For each tiny vLLM model (llama; qwen3_next, 3 Gated DeltaNet : 1 full attention; both with
their shipped weights, trained on the standard library's docstrings) one PrfaaS prefill instance
and one decode instance (PrfaasConnector, prefix caching off on both, so every request's KV
crosses) serve P/D requests sent straight to the instances (the router's two bodies). Each
prompt P (held-out docstring text the models never trained on, prfaas.bench.stdlib_text, in the
model's tokens; lengths across the 128-token block and the 1024-token prefill chunk) goes once
with its KV as cached (bf16): the reference, whose greedy 16-token continuation C and logprobs
are kept. Then each variant:
- `bf16 again`: the same request again (the noise floor: the path's own run-to-run difference);
- `fp8_e4m3`: the request's full-attention KV in fp8 on the wire (per-request `wire_dtype`;
  GDN states keep their dtype);
- `int4_per_tensor (control)`: bf16 on the wire, then every KV tensor put through 4-bit
  integers with one scale per tensor at the receiver (params.FAULTS `int4_kv`): a deliberately
  coarser quantizer, which must come out worse or the figure does not separate;
- `fp8_wrong_scale (control)`: fp8 on the wire, its codes decoded with twice their scales at the
  receiver (params.FAULTS `fp8_wrong_scale`): a wrong-scale quantizer, the same.
Teacher forcing: the variant decodes greedily with logprobs (top 20); while its tokens follow C
each position's logprob is compared with the reference's; where it leaves C, the reference
token's logprob (from the top 20; absent: counted, with the 20th's as a lower bound) is
compared, and both the variant and the bf16 path are re-sent with P + C[:pos] (a new transfer,
so every compared logprob comes from KV that crossed), the comparison going on against that
bf16 re-send. A position where the bf16 re-send itself leaves C ends that segment (a re-send
from there). Greedy agreement: the share of teacher-forced positions whose greedy token is C's,
and the share of prompts whose free 16-token continuation equals C.

    /work/bin/heavy env PYTHONPATH=src python benchmarks/bench_vllm_wire_quality.py

Writes benchmarks/results/vllm_wire_quality.json; docs/wire-format.md renders its rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import threading
import time
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.bench.stdlib_text import heldout_windows
from prfaas.integrations.vllm.model_builder import ensure_model
from prfaas.integrations.vllm.reference import post_completion
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import Topology, load_topology

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "vllm_wire_quality.json"
TOKENS = 16  # continuation tokens compared per prompt
TOP = 20  # vLLM's default max_logprobs
# across the 128-token block, the 16-token scale block and the 1024-token prefill chunk
# (1025 and 2049 = 1024k + 1: on qwen3_next the P/D path then equals the single instance exactly)
LENGTHS = (60, 127, 128, 129, 700, 1023, 1024, 1025, 1500, 2049)
MODELS = {"llama": "vllm-local-llama.yaml", "qwen3_next": "vllm-local.yaml"}
LABELS = {"llama": "vLLM tiny llama (bf16 cache)",
          "qwen3_next": "vLLM tiny qwen3_next (GDN:attention 3:1, bf16 cache)"}
VARIANTS = {"bf16 again": {}, "fp8_e4m3": {"send": {"wire_dtype": "fp8_e4m3"}},
            "int4_per_tensor (control)": {"recv": {"fault": "int4_kv"}},
            "fp8_wrong_scale (control)": {"send": {"wire_dtype": "fp8_e4m3"},
                                          "recv": {"fault": "fp8_wrong_scale"}}}
SHORT_TOKENS = 700  # below: a prompt of at most one 128-token block and a bit
MAX_SEGMENTS = 4  # forced segments per prompt and variant (a coarse control diverges often)
_tid = count(10**7)


def topology(arch: str, model_dir: Path) -> Topology:
    topo = load_topology(REPO / "topologies" / MODELS[arch])
    assert topo.vllm is not None
    vllm = dataclasses.replace(topo.vllm, model_dir=str(model_dir), kv_events=False)
    nocache = ("--no-enable-prefix-caching",)  # every request's KV crosses
    workers = tuple(dataclasses.replace(w, port=0, kv_port=0, vllm_args=nocache)
                    for w in topo.workers if w.role != "pd-p")
    return dataclasses.replace(topo, vllm=vllm, workers=workers, router_port=0)


def post(url: str, body: dict[str, Any], timeout_s: float = 600) -> tuple[int, dict[str, Any]]:
    return post_completion(url, body, timeout_s)


@dataclasses.dataclass
class Reply:
    ids: list[int]
    lps: list[float]
    tops: list[dict[str, float]]
    kv_bytes: int


def pd(topo: Topology, prompt: list[int], n: int, send: dict[str, Any] | None = None,
       recv: dict[str, Any] | None = None) -> Reply:
    """One P/D request (prefill on prfaas-0, KV over a fast per-request link, decode on pdd-0)."""
    pre, dec = topo.worker("prfaas-0"), topo.by_role("pd-d")[0]
    tid = next(_tid)
    base = {"model": "tiny", "prompt": prompt, "temperature": 0, "return_token_ids": True}
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(p=post(pre.url, {
        **base, "max_tokens": 1, "kv_transfer_params": {"prfaas": {
            "role": "send", "transfer_id": tid, "dest_host": dec.host, "dest_port": dec.kv_port,
            "rate_gbps": 10.0, **(send or {})}}})))
    thread.start()
    status, reply = post(dec.url, {**base, "max_tokens": n, "logprobs": TOP,
                                   "return_tokens_as_token_ids": True,
                                   "kv_transfer_params": {"prfaas": {
                                       "role": "recv", "transfer_id": tid, **(recv or {})}}})
    thread.join(600)
    assert status == 200, reply
    assert out["p"][0] == 200, out["p"]
    c = reply["choices"][0]
    kv = ((out["p"][1].get("kv_transfer_params") or {}).get("prfaas") or {}).get("kv_bytes")
    return Reply(c["token_ids"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"],
                 int(kv or 0))


def _lp(top: dict[str, float], token: int) -> tuple[float, bool]:
    """The logprob of `token` in a top-20 entry, or the 20th's (a bound) and False."""
    lp = top.get(f"token_id:{token}")
    return (float(lp), True) if lp is not None else (min(top.values()), False)


def teacher_forced(topo: Topology, prompt: list[int], ref: Reply, variant: dict[str, Any]
                   ) -> dict[str, Any]:
    cont = ref.ids
    errs: list[float] = []
    agree: list[bool] = []
    outside = 0
    pos, segments, base, first_kv = 0, 0, ref, 0
    greedy_equal = False
    while pos < TOKENS and segments < MAX_SEGMENTS:
        if pos > 0:  # the bf16 path with the same forced prefix: this segment's reference
            base = pd(topo, prompt + cont[:pos], TOKENS - pos)
        got = pd(topo, prompt + cont[:pos], TOKENS - pos, variant.get("send"), variant.get("recv"))
        if pos == 0:
            greedy_equal, first_kv = got.ids == cont, got.kv_bytes
        segments += 1
        k = 0
        while k < len(got.ids) and base.ids[k] == cont[pos + k]:
            if got.ids[k] == cont[pos + k]:
                errs.append(abs(got.lps[k] - base.lps[k]))
                agree.append(True)
                k += 1
                continue
            lp, found = _lp(got.tops[k], cont[pos + k])
            errs.append(abs(lp - base.lps[k]))
            agree.append(False)
            outside += not found
            k += 1
            break
        pos += max(k, 1)
    return {"abs_err": errs, "agree": agree, "outside_top": outside, "segments": segments,
            "greedy_equal": greedy_equal, "kv_bytes": first_kv}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    err = np.concatenate([r["abs_err"] for r in rows])
    first = np.array([r["abs_err"][0] for r in rows])
    return {"positions": int(err.size),
            "teacher_logprob_abs_err": {"mean": float(err.mean()),
                                        "p99": float(np.quantile(err, 0.99)),
                                        "max": float(err.max())},
            "first_token_abs_err": {"mean": float(first.mean()), "max": float(first.max())},
            "top1_agreement": float(np.mean(np.concatenate([r["agree"] for r in rows]))),
            "greedy_equal_fraction": float(np.mean([r["greedy_equal"] for r in rows])),
            "reference_outside_top20": int(sum(r["outside_top"] for r in rows)),
            "requests": int(sum(2 * r["segments"] - 1 for r in rows)),
            "kv_bytes_total": int(sum(r["kv_bytes"] for r in rows)),
            # the worst teacher-forced error of prompts shorter than SHORT_TOKENS, and of the rest
            "max_abs_err_by_prompt_length": {
                f"under_{SHORT_TOKENS}": max((max(r["abs_err"]) for r in rows
                                              if r["length"] < SHORT_TOKENS), default=None),
                f"from_{SHORT_TOKENS}": max((max(r["abs_err"]) for r in rows
                                             if r["length"] >= SHORT_TOKENS), default=None)},
            # per prompt, in prompt order: (length, first token's error, worst error)
            "per_prompt": [[r["length"], r["abs_err"][0], max(r["abs_err"])] for r in rows]}


def run_model(arch: str, count_: int, seed: int, root: Path) -> dict[str, Any]:
    from tokenizers import Tokenizer

    model = ensure_model(arch, root / arch, seed=0)
    topo = topology(arch, model)
    lengths = [LENGTHS[i % len(LENGTHS)] for i in range(count_)]
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    prompts = heldout_windows(lambda text: list(tok.encode(text).ids), lengths, seed)
    per: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    ref_bytes = 0
    t0 = time.perf_counter()
    with Deployment(topo, root / f"logs-{arch}", start_timeout_s=900) as dep:
        for i, prompt in enumerate(prompts):
            ref = pd(dep.topology, prompt, TOKENS)
            ref_bytes += ref.kv_bytes
            for name, variant in VARIANTS.items():
                row = teacher_forced(dep.topology, prompt, ref, variant)
                per[name].append({**row, "length": len(prompt)})
            print(f"{arch} prompt {i} ({len(prompt)} tokens, "
                  f"{time.perf_counter() - t0:.0f} s): " + ", ".join(
                f"{n} max {max(per[n][-1]['abs_err']):.2e}" for n in VARIANTS), flush=True)
    return {"prompts": len(prompts), "prompt_lengths_tokens": sorted(set(lengths)),
            "continuation_tokens": TOKENS, "wall_s": round(time.perf_counter() - t0, 1),
            "reference_kv_bytes_total": ref_bytes,
            "variants": {n: summarize(rows) for n, rows in per.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=20, help="per model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="prfaas-vllm-wire-") as tmp:
        for arch in args.models.split(","):
            results[LABELS[arch]] = run_model(arch, args.prompts, args.seed, Path(tmp))
            print(LABELS[arch], json.dumps({n: v["teacher_logprob_abs_err"] for n, v in
                                            results[LABELS[arch]]["variants"].items()}))
    OUT.write_text(json.dumps({
        "what": "teacher-forced logprob error of fp8 KV on the wire (PrfaasConnector) vs the "
                "same P/D path with the KV as cached (bf16); full-attention KV only (GDN "
                "states keep their dtype); int4 per tensor at the receiver: negative control",
        "engine": "vLLM (CPU build), the tiny models' shipped weights (trained on the stdlib's "
                  "docstrings: trained_models.json), bf16 cache",
        "prompts": "held-out stdlib docstrings (prfaas.bench.stdlib_text), the model's tokens",
        "continuation_tokens": TOKENS, "seed": args.seed,
        "command": "/work/bin/heavy env PYTHONPATH=src python "
                   f"benchmarks/bench_vllm_wire_quality.py --prompts {args.prompts}",
        "host": platform.node(), "presets": results}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
