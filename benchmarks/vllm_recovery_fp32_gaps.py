"""Where the recovery run's outputs parted from the reference, was it a near-tie? (issue 20, 5)

    PYTHONPATH=src .venv/bin/python benchmarks/vllm_recovery_fp32_gaps.py \
        [--run benchmarks/results/vllm_recovery_small_cache.json]

Reads a finished `bench_vllm_recovery.py` run (it records where each output parted from the
reference, not the tokens), rebuilds its prompts from the benchmark's seed (checked: every
prompt length must equal the one the run recorded) and runs the same tiny Llama (seed 0) in
float32 with transformers on CPU, greedily, over each parted request's output length. At
each position it records the float32 gap between the top two logits in units of the bf16
spacing (ulp) at the top logit, 2^(floor(log2|z|) - 7): vLLM's logits are bf16 numbers (the
lm_head's output in the model's dtype), so two logits within 2 ulp can swap order from one
rounding difference of the final matmul alone, which a batch of another shape (another
summation order) can cause. A KV block written in the wrong place moves logits by whole
units (hundreds of ulp: a wrong token's gap is printed as the control). Caveat: the float32
greedy path stands in for vLLM's bf16 path up to the parting position (the run did not store
the reference's tokens); `bench_vllm_recovery.py` now checks on the reference's own tokens.
Writes benchmarks/results/vllm_recovery_fp32_gaps.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any

from prfaas.integrations.vllm.model_builder import ensure_model

ROOT = Path(__file__).resolve().parents[1]


def _ulp(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def _prompts(seed: int, pressure: int, requests: int) -> tuple[list[list[int]], list[Any]]:
    """bench_vllm_recovery's draws, in its order: the pressure prompts, then the kills'."""
    rng = random.Random(seed)
    press = [[rng.randrange(3, 1000) for _ in range(rng.randrange(1100, 1260))]
             for _ in range(pressure)]
    kills: list[Any] = []
    for i in range(requests):
        if i == 3:
            kills.append(None)  # the text prompt
        elif i % 2:
            kills.append([rng.randrange(3, 1000) for _ in range(rng.randrange(1200, 3000))])
        else:
            kills.append([rng.randrange(3, 1000) for _ in range(rng.randrange(100, 900))])
    return press, kills


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path,
                    default=ROOT / "benchmarks" / "results" / "vllm_recovery_small_cache.json")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "vllm_recovery_fp32_gaps.json")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    run = json.loads(args.run.read_text())
    press, kills = _prompts(20, run["pressure"]["requests"], run["kills"]["requests"])
    assert [len(p) for p in press] == run["pressure"]["prompt_tokens"], "not this run's prompts"
    assert all(r["prompt_tokens"] == "text" if p is None else r["prompt_tokens"] == len(p)
               for p, r in zip(kills, run["kills"]["rows"], strict=True)), "not this run's"
    # every request with a token prompt (the parted ones and, as the base rate, the rest)
    cases = [(f"pressure[{i}]", press[i], at, run["pressure"]["output_tokens"])
             for i, at in enumerate(run["pressure"]["first_divergence"])]
    cases += [(f"kills.rows[{r['i']}]", kills[r["i"]], r["first_divergence"],
               run["kills"]["max_tokens"]) for r in run["kills"]["rows"]
              if kills[r["i"]] is not None]
    with tempfile.TemporaryDirectory() as tmp:
        lm = AutoModelForCausalLM.from_pretrained(str(ensure_model("llama", Path(tmp) / "m", 0)),
                                                  dtype=torch.float32).eval()
        rows, every = [], []
        for label, prompt, at, n in cases:
            with torch.no_grad():
                out = lm.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                  output_logits=True, return_dict_in_generate=True)
            gaps = []
            for z in out.logits:
                top = torch.topk(z[0].float(), 2).values
                gaps.append(float(top[0] - top[1]) / _ulp(float(top[0])))
            every += [g for k, g in enumerate(gaps) if k != at]
            if at is None:
                continue
            wrong = float(out.logits[at][0].max() - out.logits[at][0].min()) / _ulp(
                float(out.logits[at][0].max()))
            rows.append({"request": label, "parted_at": at,
                         "fp32_top2_gap_ulp": round(gaps[at], 3),
                         "within_2_ulp": gaps[at] <= 2,
                         "control_worst_token_gap_ulp": round(wrong, 1)})
    every.sort()
    result = {"run": str(args.run.relative_to(ROOT)) if args.run.is_relative_to(ROOT) else
              str(args.run), "bound": "fp32 top-2 gap <= 2 bf16 ulp of the top logit",
              "partings": rows, "partings_within_bound": sum(r["within_2_ulp"] for r in rows),
              "verdict": "every parting at a bf16 near-tie" if all(
                  r["within_2_ulp"] for r in rows) else "a parting outside the bound",
              "other_positions": len(every),  # every output position but the partings
              "other_positions_within_bound": sum(g <= 2 for g in every),
              "other_positions_median_gap_ulp": round(every[len(every) // 2], 2)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
