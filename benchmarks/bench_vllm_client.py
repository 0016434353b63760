"""vLLM's own benchmark client (`vllm bench serve`) against the native router.

Starts the embedded local topology (router + PrfaaS prefill + PD-P + PD-D, the tiny engine,
threshold t = 1024), builds an ASCII tokenizer that counts tokens as the router does
(benchmarks/ascii_tokenizer.py) and runs `vllm bench serve` twice: `--backend openai`
(/v1/completions) and `--backend openai-chat` (/v1/chat/completions), random prompts of
INPUT_LEN x [1 - RANGE, 1 + RANGE] tokens (so both routes are taken), OUTPUT_LEN tokens each
(`--ignore-eos`), at most CONCURRENCY in flight. Writes vLLM's figures (completed and failed
requests, TTFT / TPOT / ITL, throughput) and the router's routes to
benchmarks/results/vllm_bench_serve.json. Needs the `vllm` package (the `[vllm]` extra):
`--vllm PATH` names its CLI when it lives in another environment.
Run: .venv/bin/python benchmarks/bench_vllm_client.py [--vllm PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import load_topology

ROOT = Path(__file__).resolve().parent
MODEL = "prfaas-tiny-kda"
INPUT_LEN, RANGE, OUTPUT_LEN, NUM_PROMPTS, CONCURRENCY = 1024, 0.5, 32, 24, 4
KEYS = ("completed", "failed", "total_input_tokens", "total_output_tokens", "duration",
        "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
        "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
        "median_itl_ms")


def _routes(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {m.group(2): float(m.group(3)) for m in re.finditer(
        r'prfaas_requests_total{outcome="(ok|error)",route="(\w+)"} (\S+)', text)
        if m.group(1) == "ok"}


def run_backend(vllm: str, url: str, tokenizer: str, backend: str, endpoint: str,
                num_prompts: int, out_dir: Path) -> dict[str, Any]:
    name = f"{backend}.json"
    cmd = [vllm, "bench", "serve", "--backend", backend, "--base-url", url,
           "--endpoint", endpoint, "--model", MODEL, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
           "--random-range-ratio", str(RANGE), "--random-output-len", str(OUTPUT_LEN),
           "--num-prompts", str(num_prompts), "--max-concurrency", str(CONCURRENCY),
           "--ignore-eos", "--temperature", "0", "--seed", "0", "--save-result",
           "--result-dir", str(out_dir), "--result-filename", name]
    before = _routes(url)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve ({backend}) failed:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    raw = json.loads((out_dir / name).read_text())
    after = _routes(url)
    summary = {k: raw.get(k) for k in KEYS}
    summary["routes"] = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in after}
    summary["wall_s"] = round(wall_s, 1)
    summary["report"] = proc.stdout[proc.stdout.find("====="):].strip()
    summary["command"] = " ".join(cmd)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm", default=shutil.which("vllm") or ".venv/bin/vllm")
    parser.add_argument("--quick", action="store_true", help="6 prompts per backend")
    args = parser.parse_args()
    vllm = str(Path(args.vllm).absolute())
    if not Path(vllm).is_file():
        raise SystemExit(f"--vllm={args.vllm}: no vllm CLI there (install the [vllm] extra)")
    num_prompts = 6 if args.quick else NUM_PROMPTS
    topo = load_topology()
    topo = replace(topo, router_port=0,
                   workers=tuple(replace(w, port=0, kv_port=0) for w in topo.workers))
    with tempfile.TemporaryDirectory(prefix="prfaas-vllm-bench-") as tmp:
        tok = Path(tmp) / "tokenizer"
        subprocess.run([str(Path(vllm).parent / "python"), str(ROOT / "ascii_tokenizer.py"),
                        str(tok)], check=True, timeout=300)
        load_start = os.getloadavg()
        with Deployment(topo) as dep:
            results = {backend: run_backend(vllm, dep.url, str(tok), backend, endpoint,
                                            num_prompts, Path(tmp))
                       for backend, endpoint in (("openai", "/v1/completions"),
                                                 ("openai-chat", "/v1/chat/completions"))}
    out = {"vllm_cli": args.vllm, "topology": "embedded local.yaml (threshold 1024, tiny "
           "engine, 1 torch thread per process)", "input_len": INPUT_LEN, "range_ratio": RANGE,
           "output_len": OUTPUT_LEN, "num_prompts": num_prompts, "max_concurrency": CONCURRENCY,
           "load_average_start": load_start, "load_average_end": os.getloadavg(),
           "results": results}
    path = ROOT / "results" / "vllm_bench_serve.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    for backend, r in results.items():
        print(f"{backend}: completed {r['completed']} failed {r['failed']} routes {r['routes']} "
              f"TTFT mean {r['mean_ttft_ms']:.0f} ms TPOT mean {r['mean_tpot_ms']:.1f} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
