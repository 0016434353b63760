"""Scheduling policies in the simulator: the issue-4 figures, written to
benchmarks/results/policies.json (and printed as markdown tables for docs/policies.md).

1. Prefix hits: the Mooncake conversation trace, global unlimited cache, static threshold:
   ideal vs simulated prefix-hit fraction.
2. Policy table: the conversation trace on `mooncake-conversation` (cluster-scoped unlimited
   prefix pools, the paper's design), every policy over 3 seeds. A seed re-spreads the trace's
   ~3 s timestamp buckets: each arrival moves by U(-1.5, 1.5) s (then re-sorted), so the seeds
   are three plausible replays of the same requests at the same load.
3. Link fluctuation: `link-fluctuation` (paper case study, link 100 -> 10 -> 100 Gbps at
   300 s / 600 s), Poisson arrivals at 2.8 req/s for 900 s, N_p = 4 / N_d = 4, static t = the
   Eq. 7 optimum for that split at 100 Gbps, vs `cache-aware+controller`; 3 seeds.

Run: .venv/bin/python benchmarks/bench_policies.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.planner.search import inputs_from_scenario
from prfaas.policy.controller import ControllerConfig, solve_threshold
from prfaas.scenario import load_scenario
from prfaas.sim.metrics import egress_windows
from prfaas.sim.policy_run import run_policy
from prfaas.sim.run import build_workload
from prfaas.workload.requests import Workload

TRACE = "/work/shared/data/traces/mooncake_conversation_trace.jsonl"
OUT = Path(__file__).parent / "results" / "policies.json"
SEEDS = (0, 1, 2)
# (row label, system, policy, extra run_policy arguments)
TABLE_ROWS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("homogeneous PD", "homogeneous_pd", "all-pd", {}),
    ("naive heterogeneous", "naive_heterogeneous", "all-prfaas", {}),
    ("PrfaaS static t", "prfaas_pd", "prfaas-threshold", {}),
    ("PrfaaS cache-aware", "prfaas_pd", "cache-aware", {}),
    ("PrfaaS cache-aware + controller", "prfaas_pd", "cache-aware+controller", {}),
    ("PrfaaS cache-aware + controller + SLO 10 s", "prfaas_pd", "cache-aware+controller",
     {"ttft_slo_s": 10.0}),
    ("Mooncake load-balance", "prfaas_pd", "load-balance", {}),
    ("Mooncake local cache-aware", "prfaas_pd", "local-cache-aware", {}),
    ("Mooncake global cache-aware", "prfaas_pd", "global-cache-aware", {}),
]


def jittered(w: Workload, seed: int, width_s: float = 3.0) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.maximum(w.arrival_s + rng.uniform(-width_s / 2, width_s / 2, len(w)), 0.0)
    order = np.argsort(t, kind="stable")
    hashes = tuple(w.hash_ids[i] for i in order) if w.hash_ids is not None else None
    return Workload(t[order] - t[order][0], w.input_tokens[order], w.output_tokens[order],
                    f"{w.source} (bucket jitter seed {seed})", hashes)


def row_figures(s: dict[str, Any]) -> dict[str, Any]:
    return {"throughput_rps": s["throughput_rps"], "ttft_mean_s": s["ttft_s"]["mean"],
            "ttft_p90_s": s["ttft_s"]["p90"], "ttft_p99_s": s["ttft_s"]["p99"],
            "prefix_hit_fraction": s["prefix_hit_fraction"],
            "offload_fraction": s["offload_fraction"], "egress_mean_gbps": s["egress_gbps"]["mean"],
            "rejected": s["rejected"], "prefix_moves": s["prefix_moves"],
            "threshold_tokens": s["threshold_tokens"]}


def prefix_hits(base: Workload) -> dict[str, Any]:
    s = load_scenario("mooncake-conversation")
    _, out = run_policy(s, "prfaas_pd", "prfaas-threshold", base, cache_scope="global",
                        cache_capacity=None)
    gap = out["ideal_prefix_hit_fraction"] - out["prefix_hit_fraction"]
    return {"ideal_prefix_hit_fraction": out["ideal_prefix_hit_fraction"],
            "prefix_hit_fraction": out["prefix_hit_fraction"], "gap": round(gap, 6),
            "command": "prfaas simulate --scenario mooncake-conversation --trace "
                       f"{TRACE} --cache-scope global --cache-capacity unlimited --json"}


def policy_table(base: Workload, seeds: tuple[int, ...]) -> dict[str, Any]:
    s = load_scenario("mooncake-conversation")
    rows: dict[str, Any] = {}
    for label, system, policy, extra in TABLE_ROWS:
        runs = []
        for seed in seeds:
            _, out = run_policy(s, system, policy, jittered(base, seed), cache_scope="cluster",
                                **extra)
            runs.append(row_figures(out))
        rows[label] = {"system": system, "policy": policy, **extra, "seeds": runs,
                       "mean": {k: _mean([r[k] for r in runs]) for k in runs[0]
                                if k != "threshold_tokens"}}
        print(label, rows[label]["mean"], flush=True)
    return rows


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(float(np.mean(vals)), 4) if vals else None


def fluctuation(seeds: tuple[int, ...], duration_s: float = 900.0) -> dict[str, Any]:
    s = load_scenario("link-fluctuation")
    n_p, n_d, rate = 4, 4, 2.8
    t_static = solve_threshold(inputs_from_scenario(s), s.prfaas.instances, n_p, "exact")
    cfg = ControllerConfig()
    out: dict[str, Any] = {"rate_rps": rate, "n_p": n_p, "n_d": n_d, "static_t": t_static,
                           "dip_s": [300.0, 600.0], "dip_gbps": 10.0,
                           "controller": {"period_s": cfg.period_s,
                                          "agree_solves": cfg.agree_solves,
                                          "link_headroom": cfg.link_headroom,
                                          "recovery_time_s": cfg.recovery_time_s},
                           "runs": {}}
    for policy in ("prfaas-threshold", "cache-aware+controller"):
        runs = []
        for seed in seeds:
            w = build_workload(s.lengths, s.output_tokens, rate_rps=rate, duration_s=duration_s,
                               requests=None, arrivals="poisson", trace=None, seed=seed)
            sim, summary = run_policy(s, "prfaas_pd", policy, w, threshold_tokens=t_static,
                                      n_p=n_p, n_d=n_d)
            runs.append(_dip_figures(sim, summary, t_static))
        out["runs"][policy] = {"seeds": runs,
                               "mean": {k: _mean([r[k] for r in runs]) for k in runs[0]
                                        if not isinstance(runs[0][k], list | dict)}}
        print(policy, out["runs"][policy]["mean"], flush=True)
    static = out["runs"]["prfaas-threshold"]["mean"]["dip_ttft_p99_s"]
    ctl = out["runs"]["cache-aware+controller"]["mean"]["dip_ttft_p99_s"]
    out["dip_p99_reduction"] = round(1 - ctl / static, 4)
    return out


def _dip_figures(sim: Any, summary: dict[str, Any], t_opt: int) -> dict[str, Any]:
    """Dip figures; recovery = seconds after 600 s until t is back within 10% of the healthy-
    link optimum `t_opt` (the steady solves on a 2000-length window of a heavy-tailed
    distribution themselves scatter by about that much)."""
    log = sim.log
    arrival = np.asarray(log.arrival_s)
    ttft = np.asarray(log.kv_ready_s) - arrival
    dip = (arrival >= 300) & (arrival < 600)
    remote = np.asarray(log.remote) & dip
    offered = float(np.asarray(log.kv_bytes)[remote].sum()) * 8 / 1e9 / 300.0
    eg = egress_windows(sim)[300:600]
    history = summary.get("threshold_history", [])
    before = [t for when, t in history if when < 300]
    recovered_s = None
    if history:
        for when, t in history:
            if when >= 600 and abs(t - t_opt) <= 0.10 * t_opt:
                recovered_s = round(when - 600, 3)
                break
    return {"dip_ttft_p99_s": round(float(np.nanpercentile(ttft[dip], 99)), 4),
            "ttft_p99_s": summary["ttft_s"]["p99"],
            "dip_offered_egress_gbps": round(offered, 4),
            "dip_egress_mean_gbps": round(float(eg.mean()), 4),
            "dip_saturated_window_fraction": round(float(np.mean(eg >= 0.98 * 10.0)), 4),
            "t_before_dip": before[-1] if before else None,
            "t_recovered_after_s": recovered_s, "threshold_history": history}


def main(quick: bool = False) -> None:
    seeds = SEEDS[:1] if quick else SEEDS
    started = time.perf_counter()
    base = build_workload(load_scenario("mooncake-conversation").lengths, 343, rate_rps=None,
                          duration_s=None, requests=None, arrivals="uniform", trace=TRACE,
                          seed=0)
    result = {"prefix_hits": prefix_hits(base)}
    print(result["prefix_hits"], flush=True)
    result["policy_table"] = policy_table(base, seeds)
    result["link_fluctuation"] = fluctuation(seeds)
    result["how"] = ("benchmarks/bench_policies.py: discrete-event simulator with the "
                     "CachePlugin and cluster-scoped unlimited prefix pools for the table; seeds "
                     f"{list(seeds)}; wall {time.perf_counter() - started:.0f} s")
    if not quick:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", OUT)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, nothing written")
    main(quick=parser.parse_args().quick)
