"""Simulator vs live: one workload through `prfaas serve` and through the simulator.

Both worlds run the same policy object family (`prfaas-threshold`, t = the local topology's
1024 tokens) on the same system: 1 PrfaaS prefill, 1 PD-P, 1 PD-D, the local topology's
inter-DC link (0.05 Gbps token bucket, 4 connections, layer-wise pipelined). The simulator's
hardware is the committed CPU profile of the tiny engine (data/profiles/cpu-tiny.yaml) for both
prefill pools, decode and S_kv(l). The workload: Poisson arrivals, input lengths from a
truncated lognormal (median 1K tokens, sigma 0.7, [64, 8000]), outputs uniform in [16, 32],
`NUM_REQUESTS` requests, replayed at each of `LOAD_FRACTIONS` of the planner's capacity for this
system at t (the same draws, time axis rescaled; one `prfaas serve` for all loads). The live
run replays the exact arrival times and lengths with `prfaas.bench.loadgen` (streaming,
greedy, ignore_eos; distinct random prompts, so no prefix hits) against `prfaas serve` started
as a subprocess. Per request, the live side also reports where its TTFT went (prefill queue,
prefill compute, transfer tail; from the workers) and its prefill time against the profile's
T(l), the measurements that explain the deviation.

Run: `.venv/bin/python benchmarks/bench_sim_vs_live.py` (~2 min) -> results/sim_vs_live.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.bench.calibration import per_request_error
from prfaas.bench.loadgen import Result, run_load
from prfaas.bench.workload import BenchRequest
from prfaas.models.profile_file import load_profile_file
from prfaas.planner.throughput import bounds, stage_curves
from prfaas.scenario import parse_scenario
from prfaas.serve.native import engine_config
from prfaas.serve.router.plan import profile_path
from prfaas.serve.topology import free_port, load_topology
from prfaas.sim.metrics import per_request_rows
from prfaas.sim.policy_run import run_policy
from prfaas.workload.lengths import truncated_lognormal
from prfaas.workload.requests import Workload

OUT = Path(__file__).parent / "results" / "sim_vs_live.json"
SEED = 2026
NUM_REQUESTS = 50
LOAD_FRACTIONS = (0.3, 0.6)  # of the planner's capacity from the isolated-engine profile
MEDIAN_TOKENS, SIGMA, MIN_TOKENS, MAX_TOKENS = 1000, 0.7, 64, 8000
OUTPUT_RANGE = (16, 32)
POLICY = "prfaas-threshold"


def capacity_rps(lengths: Any, hw: Any, t: int, n_prf: int, n_p: int, link_gbps: float) -> float:
    """The planner's Λmax for this split at a fixed t (Eq. 6's prefill terms, exact mode)."""
    curves = stage_curves(lengths, np.array([float(t)]), hw.prefill, hw.prefill, hw.kv, "exact")
    _, _, prf, pdp = bounds(curves, n_prf, n_p, link_gbps * 1e9 / 8)
    return float(min(prf[0], pdp[0]))


def make_workload(lengths: Any, rate_rps: float, rng: np.random.Generator) -> Workload:
    gaps = rng.exponential(1.0 / rate_rps, NUM_REQUESTS)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return Workload(arrival, lengths.sample(rng, NUM_REQUESTS),
                    rng.integers(OUTPUT_RANGE[0], OUTPUT_RANGE[1] + 1, NUM_REQUESTS),
                    f"poisson {rate_rps:.3f} req/s, {lengths.name}")


def scenario(profile: Path, link_gbps: float, conns: int, t: int) -> dict[str, Any]:
    return {
        "name": "sim-vs-live-local",
        "description": "the local serve topology with the measured CPU profile",
        "kv": {"profile": str(profile)},
        "hardware": {"cpu": {"profile": str(profile)}},
        "clusters": {"prfaas": {"hardware": "cpu", "instances": 1},
                     "pd": {"hardware": "cpu", "instances": 2}},
        # explicit: the default baselines name the profile's own name, not the hardware key
        "baselines": {"homogeneous_pd": {"hardware": "cpu", "instances": 3},
                      "naive_heterogeneous": {"prefill": {"hardware": "cpu", "instances": 1},
                                              "decode": {"hardware": "cpu", "instances": 2}}},
        "link": {"gbps": link_gbps, "intra_gbps": 100.0, "connections": conns,
                 "pipelined": True},
        "workload": {"input": {"dist": "lognormal", "mu": float(np.log(MEDIAN_TOKENS)),
                               "sigma": SIGMA, "min_tokens": MIN_TOKENS,
                               "max_tokens": MAX_TOKENS}, "output_tokens": 24},
        "planner": {"t_step_tokens": 64, "mode": "exact"},
    }


def run_sim(raw: dict[str, Any], workload: Workload, t: int, layers: int) -> dict[str, Any]:
    s = parse_scenario(raw)
    started = time.perf_counter()
    sim, summary = run_policy(s, "prfaas_pd", POLICY, workload, threshold_tokens=t, n_p=1, n_d=1,
                              kv_layers=layers)
    rows = per_request_rows(sim)
    return {"rows": [{"ttft_s": r["kv_ready_s"] - r["arrival_s"], "route":
                      "prfaas" if r["remote"] else "pd",
                      "queue_s": r["prefill_start_s"] - r["arrival_s"],
                      "prefill_s": r["prefill_end_s"] - r["prefill_start_s"],
                      "transfer_tail_s": r["kv_ready_s"] - r["prefill_end_s"],
                      "end_s": r["finish_s"], "arrival_s": r["arrival_s"]} for r in rows],
            "kv_bytes_link": float(sim.link.bytes_sent),
            "sim_wall_s": time.perf_counter() - started,
            "events": summary["events"], "config": summary["config"]}


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        out: dict[str, Any] = json.load(resp)
        return out


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prfaas serve exited with {proc.returncode}")
        try:
            _get(f"{url}/health")
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("prfaas serve did not come up")


def _prompt(tokens: int, rng: np.random.Generator) -> str:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    return letters[rng.integers(0, letters.size, tokens - 1)].tobytes().decode()  # + BOS


def run_live(workloads: list[Workload], rng: np.random.Generator, log_dir: Path
             ) -> dict[str, Any]:
    """Start `prfaas serve` once and replay each workload in turn (fresh random prompts each
    time, so no run hits a prefix cached by an earlier one)."""
    topo = load_topology()
    topo = replace(topo, policy=POLICY, workers=tuple(replace(w, port=0, kv_port=0)
                                                      for w in topo.workers))
    path = log_dir / "topology.yaml"
    topo.dump(path)
    port = free_port()
    cli = Path(sys.executable).parent / "prfaas"
    cmd = [str(cli), "serve", "--topology", str(path), "--port", str(port), "--log-dir",
           str(log_dir / "logs")]
    with open(log_dir / "serve.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        t0 = time.perf_counter()
        _wait_healthy(url, proc)
        startup_s = time.perf_counter() - t0
        model = str(_get(f"{url}/v1/models")["data"][0]["id"])
        for w in workloads:
            reqs = [BenchRequest(_prompt(int(n), rng), int(o))
                    for n, o in zip(w.input_tokens, w.output_tokens, strict=True)]
            load0 = os.getloadavg()[0]
            results = asyncio.run(run_load(url, model, reqs, [float(a) for a in w.arrival_s]))
            runs.append({"results": results, "loadavg_1m": [load0, os.getloadavg()[0]]})
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    return {"runs": runs, "startup_s": startup_s}


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90))} if a.size else {}


def side(rows: list[dict[str, Any]], kv_link: float, out_tokens: int) -> dict[str, Any]:
    """One world's figures, computed the same way for both."""
    span = max(r["end_s"] for r in rows) - min(r["arrival_s"] for r in rows)
    by_route = {k: [r for r in rows if r["route"] == k] for k in ("prfaas", "pd")}
    return {
        "requests": len(rows), "ttft_s": _stats([r["ttft_s"] for r in rows]),
        "ttft_s_by_route": {k: _stats([r["ttft_s"] for r in v]) for k, v in by_route.items()},
        "offload_fraction": len(by_route["prfaas"]) / len(rows),
        "kv_bytes_over_link": kv_link,
        "throughput": {"requests_per_s": len(rows) / span, "output_tokens_per_s":
                       out_tokens / span, "span_s": span},
        "ttft_parts_mean_s": {k: {p: float(np.mean([r[p] for r in v])) if v else None
                                  for p in ("queue_s", "prefill_s", "transfer_tail_s")}
                              for k, v in by_route.items()},
    }


def live_rows(results: list[Result], workload: Workload) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        if not r.ok or r.ttft_s is None or r.e2e_s is None:
            continue
        p = r.prfaas
        rows.append({"index": r.index, "ttft_s": r.ttft_s, "route": p["route"],
                     "queue_s": p["prefill_queue_s"],
                     "prefill_s": p["prefill_s"], "transfer_tail_s": p["transfer_tail_s"],
                     "arrival_s": r.sent_s, "end_s": r.sent_s + r.e2e_s,
                     "input_tokens": int(workload.input_tokens[r.index]),
                     "kv_bytes": int(p["kv_bytes"]), "router_s": p["router_overhead_s"]})
    return rows


def profile_fit(rows: list[dict[str, Any]], hw: Any) -> dict[str, Any]:
    """Live prefill seconds against the profile's T(l), per route, and the least-squares line
    live = intercept + slope x T(l): a positive intercept is a fixed per-request cost the
    profile lacks, a slope above 1 a proportional slowdown (CPU shared with other processes)."""
    out: dict[str, Any] = {}
    for route in ("prfaas", "pd"):
        sel = [r for r in rows if r["route"] == route]
        prof = np.array([float(hw.prefill.time_s(r["input_tokens"])) for r in sel])
        live = np.array([r["prefill_s"] for r in sel])
        if not sel:
            out[route] = None
            continue
        slope, intercept = np.polyfit(prof, live, 1) if len(sel) > 2 else (np.nan, np.nan)
        out[route] = {"live_over_profile_mean": float(np.mean(live / prof)),
                      "min": float(np.min(live / prof)), "max": float(np.max(live / prof)),
                      "fit_intercept_s": float(intercept), "fit_slope": float(slope)}
    return out


def request_rows(workload: Workload, lrows: list[dict[str, Any]], sim_rows: list[dict[str, Any]],
                 hw: Any) -> list[list[Any]]:
    """[input_tokens, live route, live TTFT, sim TTFT, live prefill_s, profile T(l)]."""
    return [[r["input_tokens"], r["route"], round(r["ttft_s"], 4),
             round(sim_rows[r["index"]]["ttft_s"], 4), round(r["prefill_s"], 4),
             round(float(hw.prefill.time_s(r["input_tokens"])), 4)] for r in lrows]


def prefill_drift(hw: Any, lengths: tuple[int, ...] = (512, 1024, 2048)) -> dict[str, Any]:
    """The engine's prefill measured now, in this process, against the committed profile (the
    engine is under active development and the machine is shared: the profile can go stale)."""
    from prfaas.engine.engine import Engine
    from prfaas.engine.presets import engine_config
    from prfaas.engine.profiler import measure_prefill

    times, _ = measure_prefill(Engine(engine_config("tiny", threads=1)), lengths, 1)
    return {"points": [{"length_tokens": n, "now_s": t, "profile_s":
                        float(hw.prefill.time_s(n)), "now_over_profile":
                        t / float(hw.prefill.time_s(n))} for n, t in times],
            "loadavg_1m": os.getloadavg()[0]}


def kv_overhead(rows: list[dict[str, Any]], hw: Any) -> dict[str, float | None]:
    """Live shipped KV bytes minus the profile's S_kv(l), per offloaded request."""
    extra = [r["kv_bytes"] - float(hw.kv.size_bytes(r["input_tokens"]))
             for r in rows if r["route"] == "prfaas"]
    return {"mean_bytes": float(np.mean(extra)) if extra else None,
            "min_bytes": float(np.min(extra)) if extra else None,
            "max_bytes": float(np.max(extra)) if extra else None}


def compare(workload: Workload, live: dict[str, Any], sim: dict[str, Any], hw: Any
            ) -> dict[str, Any]:
    lrows = live_rows(live["results"], workload)
    out_tokens = int(workload.output_tokens.sum())
    kv_live = float(sum(r["kv_bytes"] for r in lrows if r["route"] == "prfaas"))
    live_side = side(lrows, kv_live, out_tokens)
    sim_side = side(sim["rows"], sim["kv_bytes_link"], out_tokens)
    paired = [(sim["rows"][row["index"]], row) for row in lrows]
    calibration = {
        "ttft": per_request_error(np.array([b["ttft_s"] for _, b in paired]),
                                  np.array([a["ttft_s"] for a, _ in paired])),
        "e2e": per_request_error(np.array([b["end_s"] - b["arrival_s"] for _, b in paired]),
                                 np.array([a["end_s"] - a["arrival_s"] for a, _ in paired])),
    }
    return {
        "rate_rps": workload.offered_rps(),
        "live": {**live_side, "ok": len(lrows), "errors": len(workload) - len(lrows),
                 "loadavg_1m_before_after": live["loadavg_1m"],
                 "router_overhead_mean_s": float(np.mean([r["router_s"] for r in lrows])),
                 "prefill_vs_profile": profile_fit(lrows, hw),
                 "kv_bytes_minus_profile_per_offload": kv_overhead(lrows, hw)},
        "sim": {**sim_side, "sim_wall_s": sim["sim_wall_s"], "events": sim["events"]},
        "live_over_sim": {
            **{f"ttft_{k}": live_side["ttft_s"][k] / sim_side["ttft_s"][k]
               for k in ("mean", "p50", "p90")},
            "throughput": live_side["throughput"]["requests_per_s"]
            / sim_side["throughput"]["requests_per_s"],
            "kv_bytes": kv_live / sim["kv_bytes_link"] if sim["kv_bytes_link"] else None,
            "route_agreement": float(np.mean([a["route"] == b["route"] for a, b in paired])),
            "ttft_per_request_corr": float(np.corrcoef([a["ttft_s"] for a, _ in paired],
                                                       [b["ttft_s"] for _, b in paired])[0, 1]),
        },
        "calibration": calibration,
        "requests_columns": ["input_tokens", "route", "live_ttft_s", "sim_ttft_s",
                             "live_prefill_s", "profile_prefill_s"],
        "requests": request_rows(workload, lrows, sim["rows"], hw),
    }


def main() -> int:
    started = time.perf_counter()
    prof = profile_path("cpu-tiny")
    hw = load_profile_file(prof)
    topo = load_topology()
    t = int(topo.policy_args["threshold_tokens"])
    link = topo.link.rate_gbps or 100.0
    lengths = truncated_lognormal(float(np.log(MEDIAN_TOKENS)), SIGMA, MIN_TOKENS, MAX_TOKENS)
    cap = capacity_rps(lengths, hw, t, 1, 1, link)
    rng = np.random.default_rng(SEED)
    base = make_workload(lengths, 1.0, rng)  # common random numbers: one draw, time rescaled
    workloads = [Workload(base.arrival_s / (f * cap), base.input_tokens, base.output_tokens,
                          f"{base.source} x {f * cap:.3f}") for f in LOAD_FRACTIONS]
    raw = scenario(prof, link, topo.link.connections, t)
    layers = engine_config(topo.model).num_layers  # the served model's depth sets the tail
    sims = [run_sim(raw, w, t, layers) for w in workloads]
    drift = prefill_drift(hw)
    with tempfile.TemporaryDirectory(prefix="sim-vs-live-") as tmp:
        live = run_live(workloads, rng, Path(tmp))
    result = {
        "how": __doc__.split("Run:")[0].strip() if __doc__ else "",
        "workload": {"requests": NUM_REQUESTS, "planner_capacity_rps": cap,
                     "load_fractions_of_planner_capacity": list(LOAD_FRACTIONS),
                     "input_tokens_mean": float(base.input_tokens.mean()),
                     "input_tokens_p50": float(np.percentile(base.input_tokens, 50)),
                     "input_tokens_p90": float(np.percentile(base.input_tokens, 90)),
                     "output_tokens_mean": float(base.output_tokens.mean()), "seed": SEED,
                     "policy": POLICY, "threshold_tokens": t, "link_gbps": link},
        "sim_config": sims[0]["config"],
        "live_startup_s": live["startup_s"],
        "engine_prefill_now_vs_profile": drift,
        "runs": [{"load_fraction": f, **compare(w, lv, sm, hw)} for f, w, lv, sm
                 in zip(LOAD_FRACTIONS, workloads, live["runs"], sims, strict=True)],
        "machine": {"cpus": os.cpu_count(), "profile": str(prof.name)},
        "bench_wall_s": time.perf_counter() - started,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    return 0


def _print(r: dict[str, Any]) -> None:
    w = r["workload"]
    drift = [round(p["now_over_profile"], 2) for p in r["engine_prefill_now_vs_profile"]["points"]]
    print(f"{w['requests']} requests per load; planner capacity {w['planner_capacity_rps']:.3f}"
          f" req/s; engine prefill now/profile (512, 1K, 2K): {drift}")
    for run in r["runs"]:
        live, sim = run["live"], run["sim"]
        print(f"\nload {run['load_fraction']:.0%} of planner capacity = {run['rate_rps']:.3f} "
              f"req/s; live ok {live['ok']}/{live['requests'] + live['errors']}")
        print(f"{'':<22}{'live':>10}{'sim':>10}{'live/sim':>10}")
        rows = [(f"TTFT {k} (s)", live["ttft_s"][k], sim["ttft_s"][k]) for k in
                ("mean", "p50", "p90")]
        rows += [("offload fraction", live["offload_fraction"], sim["offload_fraction"]),
                 ("KV over link (MB)", live["kv_bytes_over_link"] / 1e6,
                  sim["kv_bytes_over_link"] / 1e6),
                 ("throughput (req/s)", live["throughput"]["requests_per_s"],
                  sim["throughput"]["requests_per_s"])]
        for label, a, b in rows:
            print(f"{label:<22}{a:>10.3f}{b:>10.3f}{a / b if b else float('nan'):>10.2f}")
        print(f"prefill live/profile: {live['prefill_vs_profile']}")
        print(f"calibration (per request, sim vs live): {run['calibration']}")
        print(f"TTFT parts live: {live['ttft_parts_mean_s']}")
        print(f"TTFT parts sim:  {sim['ttft_parts_mean_s']}")
    print(f"wrote {OUT} in {r['bench_wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
