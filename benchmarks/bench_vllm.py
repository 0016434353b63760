"""PrfaasConnector on real vLLM (CPU build, tiny Llama): layer-wise streaming and NIXL side by side.

Part 1, layer-wise vs send-after-prefill. A prefill instance (producer) and a decode instance
(consumer). Measure the standalone prefill time T of a fresh 4K prompt on the prefill instance
(no transfer) and its KV bytes B (4 layers x 2 KiB/token in bf16 blocks), set the link rate
R = B / T so transfer time ~ prefill time, then alternate, with fresh prompts:
  - layer-wise:  save_kv_layer queues each layer's new blocks while the next layer computes
                 (every chunk of the chunked prefill too);
  - after:       the same connector holding every tensor until the prompt is done.
Reported: time from the prefill request to "all KV received" at the decoder (CLOCK_MONOTONIC,
one clock for all processes here) over T. Goal: layer-wise <= 1.3 T.

Part 2, TTFT and transfer at 1K/2K/4K tokens, unshaped loopback, against vLLM's NixlConnector
(UCX over TCP, `pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1`, `make vllm-nixl`):
prfaas sends the prefill and the decode request at once (the router's way); NIXL needs the
prefill's answer (remote block ids) before the decode request (vLLM's toy proxy's way).
TTFT: first request sent -> first token streamed by the decoder. Transfer: prfaas, the decoder's
first tensor -> all received (traces); NIXL, the prefill's answer -> first token (its pull plus
one decode step: an upper bound). Both pairs run one at a time on the same two cores.

    .venv/bin/python benchmarks/bench_vllm.py [--quick]
Writes benchmarks/results/vllm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prfaas.integrations.vllm.model_builder import ensure_model
from prfaas.integrations.vllm.server import VllmInstance, VllmSpec
from prfaas.serve.topology import free_port

OUT = Path(__file__).parent / "results" / "vllm.json"
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2  # layers x K,V x kv heads x head dim x bf16
COMMON = dict(max_model_len=8192, max_num_batched_tokens=1024, kv_cache_gib=1)


def post(url: str, body: dict[str, Any], stream: bool = False) -> tuple[dict[str, Any], float]:
    """The reply (or, streaming, the first chunk) and the time it arrived (monotonic)."""
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        if not stream:
            return json.loads(resp.read()), time.monotonic()
        first: dict[str, Any] | None = None
        first_s = 0.0
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunk = json.loads(line[5:])
                if first is None and chunk.get("choices"):
                    first, first_s = chunk, time.monotonic()
        assert first is not None
        return first, first_s


def prompt(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def traces(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class _Pair:
    """A prefill (p) and a decode (d) vLLM instance, started together, stopped by pid."""

    p: VllmInstance
    d: VllmInstance

    def start(self) -> None:
        self.p.spawn()
        self.d.spawn()
        self.p.wait_ready(900)
        self.d.wait_ready(900)

    def stop(self) -> None:
        self.p.stop()
        self.d.stop()


class PrfaasPair(_Pair):
    def __init__(self, model: Path, tmp: Path) -> None:
        self.kv_port = free_port()
        self.p_trace, self.d_trace = tmp / "p.trace", tmp / "d.trace"
        self.p = VllmInstance(VllmSpec(str(model), free_port(), kv_role="kv_producer",
                                       cores="0", extra={"trace_path": str(self.p_trace)},
                                       **COMMON), tmp / "p.log")  # type: ignore[arg-type]
        self.d = VllmInstance(VllmSpec(str(model), free_port(), kv_role="kv_consumer",
                                       cores="1", extra={"kv_port": self.kv_port,
                                                         "trace_path": str(self.d_trace)},
                                       **COMMON), tmp / "d.log")  # type: ignore[arg-type]
        self.tid = random.Random(7).randrange(1, 2**40)


    def run(self, ids: list[int], rate_gbps: float | None = None, after: bool = False,
            max_tokens: int = 2) -> dict[str, float]:
        self.tid += 1
        tid = self.tid
        send: dict[str, Any] = {"role": "send", "transfer_id": tid, "dest_host": "127.0.0.1",
                                "dest_port": self.kv_port}
        if rate_gbps is not None:
            send["rate_gbps"] = rate_gbps
        if after:
            send["after_prefill"] = True
        got: dict[str, float] = {}
        t0 = time.monotonic()

        def prefill() -> None:
            _, got["p_done"] = post(self.p.spec.url, {"model": "tiny", "prompt": ids,
                                                      "max_tokens": 1,
                                                      "kv_transfer_params": {"prfaas": send}})
        th = threading.Thread(target=prefill)
        th.start()
        _, first_s = post(self.d.spec.url, {"model": "tiny", "prompt": ids,
                                            "max_tokens": max_tokens, "stream": True,
                                            "kv_transfer_params": {"prfaas": {
                                                "role": "recv", "transfer_id": tid}}},
                          stream=True)
        th.join()
        done = [e for e in traces(self.d_trace) if e.get("tid") == tid and e["ev"] == "done"]
        assert done and done[0]["error"] is None, done
        end = [e for e in traces(self.p_trace) if e.get("tid") == tid and
               e["ev"] == "prefill_end"]
        return {"ttft_s": first_s - t0, "prefill_s": got["p_done"] - t0,
                "prefill_end_s": end[0]["t"] - t0, "all_kv_s": done[0]["done"] - t0,
                "transfer_s": done[0]["done"] - done[0]["first"]}


def standalone_prefill_s(pair: PrfaasPair, n: int, rng: random.Random) -> float:
    t0 = time.monotonic()
    post(pair.p.spec.url, {"model": "tiny", "prompt": prompt(n, rng), "max_tokens": 1})
    return time.monotonic() - t0


def part1(pair: PrfaasPair, reps: int, rng: random.Random) -> dict[str, Any]:
    n = 4096 - 8
    t_s = statistics.median(standalone_prefill_s(pair, n, rng) for _ in range(reps))
    kv_bytes = n * KV_BYTES_PER_TOKEN
    rate = kv_bytes * 8 / t_s / 1e9
    runs: dict[str, list[dict[str, float]]] = {"layer-wise": [], "after": []}
    for _ in range(reps):
        for mode in runs:
            runs[mode].append(pair.run(prompt(n, rng), rate, after=mode == "after"))
    out: dict[str, Any] = {"prompt_tokens": n, "standalone_prefill_s": t_s,
                           "kv_bytes": kv_bytes, "link_rate_gbps": rate, "reps": reps}
    for mode, rs in runs.items():
        out[mode] = {"all_kv_over_T_median": statistics.median(r["all_kv_s"] / t_s for r in rs),
                     "all_kv_over_own_prefill_median": statistics.median(
                         r["all_kv_s"] / r["prefill_end_s"] for r in rs),
                     "runs": rs}
    return out


class NixlPair(_Pair):
    def __init__(self, model: Path, tmp: Path) -> None:
        def spec(cores: str, side_port: int) -> VllmSpec:
            return VllmSpec(str(model), free_port(), kv_role="kv_both", connector="NixlConnector",
                            connector_module=None, extra={}, cores=cores,
                            env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                 "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)},
                            **COMMON)  # type: ignore[arg-type]
        self.p = VllmInstance(spec("0", free_port()), tmp / "nixl-p.log")
        self.d = VllmInstance(spec("1", free_port()), tmp / "nixl-d.log")


    def run(self, ids: list[int]) -> dict[str, float]:
        t0 = time.monotonic()
        reply, p_done = post(self.p.spec.url, {
            "model": "tiny", "prompt": ids, "max_tokens": 1, "kv_transfer_params": {
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}})
        _, first_s = post(self.d.spec.url, {"model": "tiny", "prompt": ids, "max_tokens": 2,
                                            "stream": True,
                                            "kv_transfer_params": reply["kv_transfer_params"]},
                          stream=True)
        return {"ttft_s": first_s - t0, "prefill_s": p_done - t0, "transfer_s": first_s - p_done}


def part2(name: str, run: Callable[[list[int]], dict[str, float]], reps: int,
          rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1024, 2048, 4096 - 8):
        runs = [run(prompt(n, rng)) for _ in range(reps)]
        out[str(n)] = {name: runs, f"{name}_median": {
            m: statistics.median(r[m] for r in runs) for m in ("ttft_s", "transfer_s")}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1 repetition instead of 3")
    ap.add_argument("--log-dir", default=None, help="keep the instances' logs and traces here")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="prfaas-bench-vllm-") as tmp_s:
        tmp = Path(args.log_dir) if args.log_dir else Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        model = ensure_model("llama", Path("out/vllm-models/llama"))
        result: dict[str, Any] = {"host": platform.node(), "python": sys.version.split()[0],
                                  "loadavg_start": os.getloadavg()}
        pair = PrfaasPair(model, tmp)
        try:
            pair.start()
            result["layerwise_vs_after"] = part1(pair, reps, rng)
            prfaas_rows = part2("prfaas", pair.run, reps, rng)
        finally:
            pair.stop()
        try:
            import nixl  # noqa: F401

            have_nixl = True
        except ImportError:
            have_nixl = False
        if have_nixl:
            nixl_pair = NixlPair(model, tmp)
            try:
                nixl_pair.start()
                for n, row in part2("nixl", nixl_pair.run, reps, rng).items():
                    prfaas_rows[n].update(row)
            finally:
                nixl_pair.stop()
        else:
            result["nixl"] = "not installed (make vllm-nixl)"
        result["ttft_vs_nixl"] = prfaas_rows
        result["loadavg_end"] = os.getloadavg()
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    lw = result["layerwise_vs_after"]
    print(f"layer-wise all-KV/T {lw['layer-wise']['all_kv_over_T_median']:.2f}x, "
          f"after {lw['after']['all_kv_over_T_median']:.2f}x (T={lw['standalone_prefill_s']:.2f}"
          f" s, R={lw['link_rate_gbps'] * 1e3:.1f} Mbit/s)")
    for n, row in prfaas_rows.items():
        line = f"{n:>5} tokens: prfaas TTFT {row['prfaas_median']['ttft_s']:.2f} s transfer " \
               f"{row['prfaas_median']['transfer_s']:.3f} s"
        if "nixl_median" in row:
            line += f" | nixl TTFT {row['nixl_median']['ttft_s']:.2f} s transfer " \
                    f"{row['nixl_median']['transfer_s']:.3f} s"
        print(line)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
