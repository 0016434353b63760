"""Resilience on vLLM (issue 20, item 5): instances SIGKILLed under mixed load, and a decoder
with a small KV cache under pressure. Writes benchmarks/results/vllm_recovery.json.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_vllm_recovery.py

`topologies/vllm-local-llama.yaml` (tiny Llama; prfaas-0, pdp-0, pdd-0, the router) on free
ports, plus the standalone reference instance (reference.py: the engine `prfaas generate
--engine vllm` starts). With `--decoder-blocks N` the decode instance's KV cache is cut to N
blocks (`--num-gpu-blocks-override`) so that it runs out of blocks under the load (the
pressure phase needs it); 0 keeps the topology's 1 GiB.

1. Reference: every prompt's greedy tokens from the reference instance; the long text prompt's
   also from `prfaas generate --engine vllm` itself (a subprocess), which must agree.
2. Pressure: `--pressure` prompts over t at once (PrfaaS route) with `--pressure-tokens`
   output tokens each; their KV streams into a decoder that cannot hold them all. vLLM's own
   counter (`vllm:num_preemptions_total` on pdd-0) says how many running requests it
   preempted; the decoder's trace says how many loads found KV that had arrived before vLLM
   gave the request its blocks. Control: the same prompts at once on the reference instance.
3. Kills: `--requests` requests (short ones under the threshold t = 1024 -> PD-P, long ones
   over it -> PrfaaS; half of them streamed): a steady stream, one every `--gap` s, then a
   burst of `--burst` at once. prfaas-0 is SIGKILLed (its whole process tree) half-way
   through the steady stream, once it is streaming a transfer; the burst goes once prfaas-0
   is back; pdd-0 (the only decoder) is SIGKILLed once the burst's first token is out, with
   the burst in flight; nothing is sent after that (a request that arrives while no decoder
   is up is refused with 503 + Retry-After, before it is accepted).
   Every request must answer 200 with the reference's tokens; the supervisor restarts both
   (new pids); afterwards one long prompt must go prfaas-0 -> pdd-0 and one short one
   pdp-0 -> pdd-0, again with the reference's tokens.
4. Sequential: `--sequential` prompts like the pressure ones, one at a time over the PrfaaS
   route: how often the P/D path's long greedy output parts from the single instance's with
   nothing else going on. Wherever an output parts from the reference, the reference's own
   top-2 logprob gap at that position is recorded (a near-tie, or a confident token).

`--only sequential` runs phase 4 alone (no CLI reference, no pressure, no kills), first after
the deployment: its prompts are then drawn from the seed exactly as the pressure phase's are,
so with `--sequential 8` they are the very prompts of a full run's pressure phase (the same
lengths, checked by `prompt_tokens` in the JSON), each sent alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from prfaas.bench.loadgen import sse_payloads
from prfaas.integrations.vllm.model_builder import ensure_model
from prfaas.integrations.vllm.reference import complete, deployment_with_reference, post_completion
from prfaas.integrations.vllm.server import VllmInstance
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "vllm_recovery.json"
SERVED = "tiny"
LONG_TEXT = " ".join(f"the prefill cluster {i} ships its kv cache over a long link to the decode "
                     f"cluster {i % 7} and the router keeps every request alive" for i in range(90))


def _topology(model: Path, decoder_blocks: int) -> Topology:
    topo = load_topology(ROOT / "topologies" / "vllm-local-llama.yaml")
    assert topo.vllm is not None
    vllm = dataclasses.replace(topo.vllm, model_dir=str(model))
    workers = []
    for w in topo.workers:
        w = dataclasses.replace(w, port=0, kv_port=0)
        if w.role == "pd-d" and decoder_blocks:
            w = dataclasses.replace(w, vllm_args=(*w.vllm_args, "--num-gpu-blocks-override",
                                                  str(decoder_blocks)))
        workers.append(w)
    return dataclasses.replace(topo, vllm=vllm, workers=tuple(workers), router_port=0)


def _post(url: str, body: dict[str, Any], timeout_s: float = 1800) -> tuple[int, dict[str, Any]]:
    return post_completion(url, body, timeout_s)


def _stream(url: str, body: dict[str, Any], timeout_s: float = 1800,
            on_first: Any = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{url}/v1/completions",
                                 json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    last: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for chunk in sse_payloads(resp):
                if "error" in chunk:
                    return 500, chunk
                if on_first is not None and chunk.get("choices"):
                    on_first()
                    on_first = None
                last = chunk
    except urllib.error.HTTPError as err:
        return err.code, {"error": err.read()[:500].decode(errors="replace")}
    return 200, last


def _routed(url: str, prompt: list[int] | str, max_tokens: int, stream: bool = False,
            on_first: Any = None) -> dict[str, Any]:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    t0 = time.monotonic()
    try:
        status, reply = _stream(url, body, on_first=on_first) if stream else _post(url, body)
    except OSError as exc:  # the router itself unreachable: lost
        status, reply = 0, {"error": f"{type(exc).__name__}: {exc}"}
    return {"status": status, "prfaas": reply.get("prfaas", {}), "error": reply.get("error"),
            "latency_s": time.monotonic() - t0}


def _metric(url: str, name: str) -> float:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return float("nan")
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _members(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
        out: dict[str, Any] = json.loads(resp.read())["members"]
    return out


def _kill_tree(pid: int) -> None:
    proc = psutil.Process(pid)
    for p in [*proc.children(recursive=True), proc]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _trace(trace_dir: Path, worker: str) -> list[dict[str, Any]]:
    path = trace_dir / f"{worker}.trace"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Killer(threading.Thread):
    """SIGKILLs a worker's process tree and times its restart: to the supervisor's new pid
    answering /health, and to the router holding it up again."""

    def __init__(self, dep: Deployment, name: str) -> None:
        super().__init__(daemon=True)
        self.dep, self.name = dep, name
        self.row: dict[str, Any] = {"worker": name}

    def kill(self, at_s: float, in_flight: int) -> None:
        self.row.update(old_pid=self.dep.pid(self.name), at_s=round(at_s, 3),
                        in_flight_at_kill=in_flight)
        self.t_kill = time.monotonic()
        _kill_tree(self.row["old_pid"])
        self.start()

    def run(self) -> None:
        url = self.dep.topology.worker(self.name).url
        deadline = self.t_kill + 1200
        while time.monotonic() < deadline:
            new = self.dep.pid(self.name)
            if new != self.row["old_pid"] and "healthy_s" not in self.row and _healthy(url):
                self.row.update(new_pid=new, healthy_s=round(time.monotonic() - self.t_kill, 2))
            if "healthy_s" in self.row:
                try:
                    if _members(self.dep.url)[self.name]["up"]:
                        self.row["router_up_s"] = round(time.monotonic() - self.t_kill, 2)
                        return
                except Exception:  # the router busy: ask again
                    pass
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--gap", type=float, default=0.4, help="seconds between two requests")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--burst", type=int, default=8,
                    help="of --requests, sent at once after the steady stream")
    ap.add_argument("--pressure", type=int, default=8, help="long prompts sent at once")
    ap.add_argument("--pressure-tokens", type=int, default=160)
    ap.add_argument("--sequential", type=int, default=8,
                    help="prompts like the pressure ones, one at a time, after the kills")
    ap.add_argument("--decoder-blocks", type=int, default=0,
                    help="pdd-0's KV cache in blocks of 128 tokens (0: the topology's 1 GiB)")
    ap.add_argument("--only", choices=["sequential"], default=None,
                    help="run only that phase (sequential: the pressure phase's prompts alone)")
    ap.add_argument("--partings-from", type=Path, default=None,
                    help="a full run's JSON (same seed): the reference's top-2 logprob gap at "
                         "its pressure phase's partings, from the sequential phase")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.only == "sequential" and not args.sequential:
        ap.error("--only sequential needs --sequential N > 0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    rng = random.Random(20)
    with tempfile.TemporaryDirectory(prefix="prfaas-vllm-recovery-") as tmp:
        root = Path(tmp)
        model = ensure_model("llama", root / "llama", seed=0)
        topo = _topology(model, args.decoder_blocks)
        result: dict[str, Any] = {"topology": "topologies/vllm-local-llama.yaml",
                                  "decoder_blocks": args.decoder_blocks,
                                  "max_retries": topo.max_retries,
                                  "path_wait_s": topo.health.path_wait_s,
                                  "uptime_before": _uptime(),
                                  "started_unix_s": time.time()}
        result["only"] = args.only
        cli_ids = [] if args.only else _cli_reference(model, args.max_tokens, result)

        log_dir = root / "logs"
        t0 = time.monotonic()
        try:
            with deployment_with_reference(topo, log_dir) as (dep, ref, trace_dir):
                assert ref is not None
                result["deploy_s"] = round(time.monotonic() - t0, 1)
                try:
                    result.update(_run(args, rng, dep, ref, trace_dir, cli_ids))
                except Exception:  # written to the JSON: a failed run is a result
                    import traceback

                    result["error"] = traceback.format_exc()[-3000:]
        finally:
            if os.environ.get("PRFAAS_BENCH_KEEP_LOGS"):
                keep = Path(os.environ["PRFAAS_BENCH_KEEP_LOGS"])
                subprocess.run(["cp", "-r", str(log_dir), str(keep)], check=False)
        result["uptime_after"] = _uptime()
        if CASES:  # after the instances stopped: the host's cores are free again
            try:
                result["fp32_check"] = _fp32_check(model, CASES)
            except Exception as exc:  # recorded, the run's figures stand
                result["fp32_check"] = {"error": repr(exc)[:500]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    s = result.get("kills", {})
    print(json.dumps({k: s.get(k) for k in ("requests", "lost", "outputs_equal", "retried",
                                            "resumed_requests", "restarts")}, indent=1))
    print(json.dumps(result.get("pressure"), indent=1))
    seq = result.get("sequential") or {}
    print(json.dumps({k: seq.get(k) for k in ("requests", "prompt_tokens", "outputs_equal",
                                              "first_divergence")}))
    print(result.get("error", ""))
    print(f"wrote {args.out}")
    return 1 if "error" in result else 0


def _cli_reference(model: Path, max_tokens: int, result: dict[str, Any]) -> list[int]:
    """`prfaas generate --engine vllm` on the long text prompt, alone on the host."""
    t0 = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "prfaas", "generate", "--engine", "vllm",
                          "--model", str(model), "--prompt", LONG_TEXT, "--max-tokens",
                          str(max_tokens), "--json"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=1200)
    assert cli.returncode == 0, cli.stderr[-2000:]
    ids: list[int] = json.loads(cli.stdout.strip().splitlines()[-1])["token_ids"]
    result["cli_generate_s"] = round(time.monotonic() - t0, 1)
    return ids


def _ref(ref: VllmInstance, prompt: list[int] | str, n: int) -> list[int]:
    ids: list[int] = complete(ref.spec.url, SERVED, prompt, n)["token_ids"]
    return ids


def _margin(ref: VllmInstance, prompt: list[int] | str, want: list[int],
            got: list[int] | None, at: int | None) -> dict[str, Any] | None:
    """Where a routed output left the reference's: the reference's own logprobs of its token
    and of the routed one at that position (prompt + the tokens both agreed on, one token).
    A gap of a few hundredths of a nat is a near-tie that bf16 rounding can flip; a wrong KV
    block would shift the logits far more and much earlier."""
    if at is None or got is None or at >= min(len(got), len(want)):
        return None
    try:
        ids = prompt if isinstance(prompt, list) else complete(
            ref.spec.url, SERVED, prompt, 1)["prompt_token_ids"]
        choice = complete(ref.spec.url, SERVED, [*ids, *want[:at]], 1, logprobs=20)
        top = choice["logprobs"]["top_logprobs"][0]  # token text -> logprob
        ids_top = choice.get("token_ids")
        ranked = sorted(top.values(), reverse=True)
        CASES.append({"prompt_ids": list(ids), "want": want, "got": got, "at": at})
        return {"at": at, "reference_token": want[at], "routed_token": got[at],
                "reference_first_id": ids_top[0] if ids_top else None,
                "top2_gap_nats": ranked[0] - ranked[1] if len(ranked) > 1 else None}
    except Exception as exc:  # a figure we could not get is recorded as such
        return {"at": at, "error": repr(exc)[:200]}


CASES: list[dict[str, Any]] = []  # every divergence _margin saw, for the fp32 check


def _bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at |x| (8 significant bits: 2^(floor(log2|x|) - 7))."""
    import math

    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def _fp32_check(model: Path, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The same model in float32 (transformers, CPU), on prompt + the reference's tokens:
    at each divergence the float32 logits of the reference's token and the routed one, and
    the bf16 spacing (ulp) at the top logit. The bound: vLLM's logits are bf16 numbers (the
    lm_head's output), so two logits within 2 ulp of each other can swap order from one
    rounding difference of the final matmul alone (each may land one representable number
    up or down); a batch of another shape sums in another order and can do that. A KV block
    written in the wrong place shifts the logits by whole units, not ulps. Control, over
    every other output position of the same requests: the float32 top-2 gaps (how rare a
    near-tie is), and how often the float32 argmax is the reference's bf16 token."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    rows, all_gaps_over_ulp, agree, total = [], [], 0, 0
    for c in cases:
        ids = [*c["prompt_ids"], *c["want"]]
        with torch.no_grad():
            logits = lm(torch.tensor([ids])).logits[0].float()
        n0 = len(c["prompt_ids"]) - 1  # logits[n0 + k] predict output token k
        for k in range(len(c["want"])):
            z = logits[n0 + k]
            top2 = torch.topk(z, 2)
            gap = float(top2.values[0] - top2.values[1])
            if k != c["at"]:
                all_gaps_over_ulp.append(gap / _bf16_ulp(float(top2.values[0])))
                agree += int(int(top2.indices[0]) == c["want"][k])
                total += 1
        z = logits[n0 + c["at"]]
        zr, zg = float(z[c["want"][c["at"]]]), float(z[c["got"][c["at"]]])
        top = float(z.max())
        ulp = _bf16_ulp(top)
        rows.append({"at": c["at"], "fp32_top_logit": round(top, 4),
                     "fp32_reference_token_logit": round(zr, 4),
                     "fp32_routed_token_logit": round(zg, 4),
                     "fp32_argmax": int(z.argmax()),
                     "fp32_gap_reference_minus_routed": round(zr - zg, 5),
                     "bf16_ulp_at_top": ulp,
                     "gap_over_ulp": round(abs(zr - zg) / ulp, 3),
                     "within_2_ulp": abs(zr - zg) <= 2 * ulp})
    all_gaps_over_ulp.sort()
    m = len(all_gaps_over_ulp)
    return {"bound": "|z_ref - z_routed| <= 2 bf16 ulp of the top logit (2^(floor(log2|z|)-7))",
            "divergences": rows,
            "divergences_within_bound": sum(r["within_2_ulp"] for r in rows),
            "control_positions": m,
            "control_within_2_ulp": sum(g <= 2 for g in all_gaps_over_ulp),
            "control_top2_gap_over_ulp_median": all_gaps_over_ulp[m // 2] if m else None,
            "control_fp32_argmax_equals_reference": agree, }


def _diverge(got: list[int] | None, want: list[int]) -> int | None:
    """Index of the first token that differs (None: equal)."""
    if got == want:
        return None
    got = got or []
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)))


def _pressure(args: argparse.Namespace, rng: random.Random, dep: Deployment, ref: VllmInstance,
              trace_dir: Path) -> dict[str, Any]:
    """Long prompts at once into a decoder that cannot hold them all, with a control: the same
    prompts at once on the reference instance (vLLM alone, batched), against its own answers
    one at a time. bf16 results depend on the batch a row is computed in; with random weights
    a near-tie can flip a greedy token late in a long output, which the control measures."""
    n = args.pressure_tokens
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(1100, 1260))]
               for _ in range(args.pressure)]
    want = [_ref(ref, p, n) for p in prompts]
    dec_url = dep.topology.worker("pdd-0").url
    before = _metric(dec_url, "vllm:num_preemptions_total")
    tids_before = {e["tid"] for e in _trace(trace_dir, "pdd-0")}
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: _routed(dep.url, p, n), prompts))
    wall_s = time.monotonic() - t0
    preempted = _metric(dec_url, "vllm:num_preemptions_total") - before
    with ThreadPoolExecutor(len(prompts)) as pool:  # the control: vLLM alone, batched
        batched = list(pool.map(lambda p: _ref(ref, p, n), prompts))
    loads = [e for e in _trace(trace_dir, "pdd-0") if e["ev"] == "load"
             and e["tid"] not in tids_before]
    got = [r["prfaas"].get("token_ids") for r in replies]
    return {
        "requests": len(prompts), "prompt_tokens": [len(p) for p in prompts],
        "output_tokens": n, "decoder_blocks": args.decoder_blocks, "wall_s": round(wall_s, 2),
        "decoder_preemptions": preempted,
        "ok": sum(r["status"] == 200 for r in replies),
        "routes": [r["prfaas"].get("route") for r in replies],
        "retried": sum(bool(r["prfaas"].get("retried")) for r in replies),
        "outputs_equal": sum(g == w for g, w in zip(got, want, strict=True)),
        "first_divergence": [_diverge(g, w) for g, w in zip(got, want, strict=True)],
        "reference_at_divergence": [_margin(ref, p, w, g, _diverge(g, w))
                                    for p, g, w in zip(prompts, got, want, strict=True)],
        "control_batched_reference_equal": sum(b == w for b, w in zip(batched, want,
                                                                       strict=True)),
        "control_first_divergence": [_diverge(b, w) for b, w in zip(batched, want,
                                                                     strict=True)],
        "loads_with_kv_held": sum(e["held"] > 0 for e in loads),
        "loads": len(loads), "held_tensors": [e["held"] for e in loads],
        "errors": [r["error"] for r in replies if r["status"] != 200]}


def _run(args: argparse.Namespace, rng: random.Random, dep: Deployment, ref: VllmInstance,
         trace_dir: Path, cli_ids: list[int]) -> dict[str, Any]:
    n = args.max_tokens
    url = dep.url
    out: dict[str, Any] = {}
    if args.only == "sequential":
        return {"sequential": _sequential(args, rng, dep, ref)}
    ref_long_text = _ref(ref, LONG_TEXT, n)
    out["cli_reference_equal"] = ref_long_text == cli_ids  # the instance is the CLI's engine
    if args.pressure:
        out["pressure"] = _pressure(args, rng, dep, ref, trace_dir)

    # -- kills under mixed load: a steady stream, then a burst -------------------------
    steady, burst = args.requests - args.burst, args.burst
    prompts: list[list[int] | str] = []
    for i in range(args.requests):
        if i == 3:
            prompts.append(LONG_TEXT)  # checked against `prfaas generate --engine vllm`
        elif i % 2:
            prompts.append([rng.randrange(3, 1000) for _ in range(rng.randrange(1200, 3000))])
        else:
            prompts.append([rng.randrange(3, 1000) for _ in range(rng.randrange(100, 900))])
    want = [cli_ids if p == LONG_TEXT else _ref(ref, p, n) for p in prompts]
    in_flight: set[int] = set()
    lock = threading.Lock()
    results: list[dict[str, Any] | None] = [None] * len(prompts)
    first_token = threading.Event()  # a request of the burst has its first token
    steady_half = threading.Event()
    killers = {name: Killer(dep, name) for name in ("prfaas-0", "pdd-0")}
    t0 = time.monotonic()

    burst_go = threading.Event()  # prfaas-0 is back: the burst goes over both routes
    burst_at = [0.0]

    def one(i: int) -> None:
        if i < steady:  # one every `gap` s
            time.sleep(max(0.0, t0 + i * args.gap - time.monotonic()))
        else:
            burst_go.wait()
        with lock:
            in_flight.add(i)
        if i == steady // 2:
            steady_half.set()
        stream = i % 4 in (1, 2)
        try:
            r = _routed(url, prompts[i], n, stream=stream,
                        on_first=first_token.set if i >= steady else None)
        except Exception as exc:  # a broken reply: lost
            r = {"status": -1, "prfaas": {}, "error": repr(exc), "latency_s": 0.0}
        r.update(sent_s=round(i * args.gap if i < steady else burst_at[0], 2),
                 done_s=round(time.monotonic() - t0, 2))
        with lock:
            in_flight.discard(i)
        results[i] = r

    old_tids = {e["tid"] for e in _trace(trace_dir, "prfaas-0")}
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(one, i) for i in range(len(prompts))]
        # prfaas-0, half-way through the steady stream, once it is streaming a transfer
        steady_half.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ev = _trace(trace_dir, "prfaas-0")
            sent_tids = {e["tid"] for e in ev if e["ev"] == "sent"} | old_tids
            if any(e["ev"] == "layer" and e["tid"] not in sent_tids for e in ev):
                break
            time.sleep(0.02)
        with lock:
            killers["prfaas-0"].kill(time.monotonic() - t0, len(in_flight))
        # the burst once prfaas-0 is back (its long prompts take the PrfaaS route again);
        # pdd-0, the only decoder, is killed once the burst's first token is out (the rest of
        # the burst queued, prefilling, streaming KV or decoding); nothing is sent after it
        killers["prfaas-0"].join(1200)
        time.sleep(1.0)
        burst_at[0] = time.monotonic() - t0
        burst_go.set()
        first_token.wait(600)
        with lock:
            killers["pdd-0"].kill(time.monotonic() - t0, len(in_flight))
            out["in_flight_at_decoder_kill"] = sorted(in_flight)
        for f in futures:
            f.result()
    for k in killers.values():
        k.join(1200)
    wall_s = time.monotonic() - t0
    rows = []
    for i, (p, r, w) in enumerate(zip(prompts, results, want, strict=True)):
        assert r is not None
        pf = r["prfaas"]
        rows.append({"i": i, "prompt_tokens": len(p) if isinstance(p, list) else "text",
                     "streamed": i % 4 in (1, 2), "burst": i >= steady, "status": r["status"],
                     "first_route": pf.get("first_route"), "route": pf.get("route"),
                     "prefill_node": pf.get("prefill_node"), "decode_node": pf.get("decode_node"),
                     "retried": pf.get("retried"), "resumed": pf.get("resumed"),
                     "reason": (pf.get("resume_reason") or pf.get("retry_reason") or "")[:160],
                     "equal": pf.get("token_ids") == w,
                     "first_divergence": _diverge(pf.get("token_ids"), w),
                     "reference_at_divergence": _margin(ref, p, w, pf.get("token_ids"),
                                                        _diverge(pf.get("token_ids"), w)),
                     "sent_s": r["sent_s"], "done_s": r["done_s"],
                     "latency_s": round(r["latency_s"], 2), "error": r["error"]})
    # -- the restarted instances serve again --------------------------------------------
    [long_, short] = [[rng.randrange(3, 1000) for _ in range(k)] for k in (2000, 300)]
    after_rows = []
    for label, p in (("long", long_), ("short", short)):
        r = _routed(url, p, n)
        pf = r["prfaas"]
        after_rows.append({"prompt": label, "status": r["status"], "route": pf.get("route"),
                           "prefill_node": pf.get("prefill_node"),
                           "decode_node": pf.get("decode_node"), "retried": pf.get("retried"),
                           "latency_s": round(r["latency_s"], 2),
                           "equal": pf.get("token_ids") == _ref(ref, p, n)})
    out["kills"] = {
        "requests": len(rows), "steady": steady, "burst": burst, "gap_s": args.gap,
        "max_tokens": n, "wall_s": round(wall_s, 1),
        "lost": sum(r["status"] != 200 for r in rows),
        "outputs_equal": sum(r["equal"] for r in rows),
        "retried": sum(bool(r["retried"]) for r in rows),
        "resumed_requests": sum(bool(r["resumed"]) for r in rows),
        "routes_first": {k: sum(r["first_route"] == k for r in rows) for k in ("pd", "prfaas")},
        "kills": [k.row for k in killers.values()],
        "restarts": dep.restarts,
        "after_restart": after_rows,
        "rows": rows}
    if args.sequential:
        try:
            out["sequential"] = _sequential(args, rng, dep, ref)
        except Exception:  # recorded; the kills' figures above stand
            import traceback

            out["sequential"] = {"error": traceback.format_exc()[-2000:]}
    return out


def _sequential(args: argparse.Namespace, rng: random.Random, dep: Deployment,
                ref: VllmInstance) -> dict[str, Any]:
    """The pressure phase's kind of prompt and output length, one request at a time (no
    kill, no preemption, no KV held, nothing else in the decoder's batch): how often the P/D
    path's greedy output parts from the single instance's over `--pressure-tokens` tokens,
    and the reference's top-2 logprob gap where it does. The reference's own top-2 gap is
    kept at every output position (vLLM's logprobs of its bf16 logits: the gap in logprob is
    the gap in logit), so a parting seen elsewhere on the same prompts (`--partings-from`, a
    full run's JSON with the same seed) can be looked up: a near-tie or a confident token."""
    n = args.pressure_tokens
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(1100, 1260))]
               for _ in range(args.sequential)]
    rows = []
    for p in prompts:
        want, gaps = _ref_gaps(ref, p, n)
        r = _routed(dep.url, p, n)
        got = r["prfaas"].get("token_ids")
        at = _diverge(got, want)
        rows.append({"prompt_tokens": len(p), "status": r["status"],
                     "route": r["prfaas"].get("route"), "retried": r["prfaas"].get("retried"),
                     "equal": got == want, "first_divergence": at,
                     "reference_at_divergence": _margin(ref, p, want, got, at),
                     "reference_top2_gap_nats": gaps})
    out = {"requests": len(rows), "output_tokens": n,
           "prompt_tokens": [len(p) for p in prompts],
           "outputs_equal": sum(r["equal"] for r in rows),
           "first_divergence": [r["first_divergence"] for r in rows], "rows": rows}
    if args.partings_from:
        out["partings_elsewhere"] = _partings(args.partings_from, rows)
    return out


def _ref_gaps(ref: VllmInstance, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The reference's greedy tokens and, at each, its top-2 logprob gap (nats)."""
    choice = complete(ref.spec.url, SERVED, prompt, n, logprobs=2,
                      return_tokens_as_token_ids=True)
    gaps = []
    for top in choice["logprobs"]["top_logprobs"]:  # "token_id:N" -> logprob
        first, second = sorted(top.values(), reverse=True)[:2]
        gaps.append(round(first - second, 6))
    return choice["token_ids"], gaps


def _partings(path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The pressure phase's partings in run `path` (the same prompts: lengths checked), with
    the reference's top-2 gap there and how many of every output position here have a gap
    that small or smaller (a gap of 0: the two logits are the same bf16 number)."""
    pressure = json.loads(path.read_text())["pressure"]
    if pressure["prompt_tokens"] != [r["prompt_tokens"] for r in rows]:
        raise ValueError(f"{path}: pressure prompts {pressure['prompt_tokens']} are not "
                         f"these {[r['prompt_tokens'] for r in rows]} (seed or count differ)")
    every = sorted(g for r in rows for g in r["reference_top2_gap_nats"])
    partings = []
    for i, at in enumerate(pressure["first_divergence"]):
        if at is not None:
            gap = rows[i]["reference_top2_gap_nats"][at]
            partings.append({"request": i, "at": at, "reference_top2_gap_nats": gap,
                             "positions_with_a_gap_at_most_this": sum(g <= gap for g in every)})
    return {"run": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "positions": len(every), "median_gap_nats": every[len(every) // 2],
            "partings": partings}


if __name__ == "__main__":
    sys.exit(main())
