"""What fp8 and lossless compression on the wire buy: plan and simulated capacity and TTFT,
bf16 vs fp8 KV on the link, each without and with zstd.

For the scenarios `public-internet` and `link-fluctuation` (the paper's case study over a
20.58 Gbps public path, and over a 100 Gbps link that dips to 10 Gbps for 300 s), each with
its KV as measured by the paper (bf16 cache) and with `link: {wire_dtype: fp8_e4m3}`
(Scenario.wire_kv: the per-token, full-attention part at 1 byte per element plus one fp32
scale per 16 tokens per 64-element vector; the linear state keeps its bytes): the exact and
paper-mode plans, the simulator's capacity search on the exact plan's configuration (as
`prfaas capacity` runs it), and one simulation at a fixed offered rate (the same for both
wire dtypes: 90% of the bf16 capacity) for TTFT, with the dip window of link-fluctuation
apart. Systems: PrfaaS-PD (threshold routing) and naive heterogeneous (every prefill remote,
so every request's KV crosses the link). The `+ zstd` rows set `link: {compression: zstd}`:
S_kv(l) on the wire over the zstd ratio measured on the native KDA:MLA engine's KV in that
dtype (data/codec_speeds.json, from transport.json), and each simulated transfer capped at
the link's connections x the codec's measured one-thread rate / ratio (Scenario.flow_cap_gbps);
`auto_codec` records what `compression: auto` would pick on each link (the live sender's rule).

    PYTHONPATH=src python benchmarks/bench_wire_capacity.py [--requests 4000]

Writes benchmarks/results/wire_capacity.json; docs/wire-format.md renders its table.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.models.catalog import find_model
from prfaas.models.compression import codec_table, wire_ratio
from prfaas.models.kv import geometry
from prfaas.planner.search import plan_all
from prfaas.scenario import Scenario, load_scenario, parse_scenario
from prfaas.sim.capacity import find_capacity
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic

OUT = Path(__file__).resolve().parent / "results" / "wire_capacity.json"
SCENARIOS = ("public-internet", "link-fluctuation")
SYSTEMS = ("prfaas_pd", "naive_heterogeneous")
# label -> (link.wire_dtype, link.compression)
WIRE = {"bf16": (None, "none"), "fp8_e4m3": ("fp8_e4m3", "none"),
        "bf16 + zstd": (None, "zstd"), "fp8_e4m3 + zstd": ("fp8_e4m3", "zstd")}
DIP_S = (300.0, 600.0)  # link-fluctuation's 10 Gbps window
FIXED_RATE_SHARE = 0.9


def scenario_with(name: str, wire_dtype: str | None, compression: str = "none") -> Scenario:
    base = load_scenario(name)
    raw = copy.deepcopy(base.raw)
    if wire_dtype is not None:
        raw["link"]["wire_dtype"] = wire_dtype
    if compression != "none":
        raw["link"]["compression"] = compression
    return parse_scenario(raw, base.path)


def _plan_json(plan: Any) -> dict[str, Any]:
    return {"lambda_max": plan.lambda_max, "threshold_tokens": plan.threshold_tokens,
            "egress_gbps": plan.egress_gbps, "ttft_mean_s": plan.ttft_mean_s,
            "ttft_p90_s": plan.ttft_p90_s, "bottleneck": plan.bottleneck,
            "n_p": plan.n_p, "n_d": plan.n_d}


def fixed_rate(s: Scenario, cfg: Any, rate: float, requests: int, seed: int) -> dict[str, Any]:
    workload = synthetic(s.lengths, s.output_tokens, make_arrivals("uniform"), rate, requests,
                         seed, stratified=True)
    sim, summary = simulate(cfg, workload)
    arrival = np.asarray(sim.log.arrival_s)
    ttft = np.asarray(sim.log.kv_ready_s) - arrival
    out = {"rate_rps": rate, "throughput_rps": summary["throughput_rps"],
           "ttft_s": summary["ttft_s"], "egress_gbps": summary["egress_gbps"],
           "link_utilization": summary["utilization"]["link"]}
    if s.name == "link-fluctuation" and arrival.max() >= DIP_S[1]:
        dip = (arrival >= DIP_S[0]) & (arrival < DIP_S[1])
        out["ttft_dip_s"] = {"mean": float(ttft[dip].mean()),
                             "p90": float(np.quantile(ttft[dip], 0.9)),
                             "requests": int(dip.sum())}
    return out


def measure(name: str, requests: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    caps: dict[str, float] = {}
    for label, (wire, codec) in WIRE.items():
        s = scenario_with(name, wire, codec)
        exact = plan_all(s, mode="exact")
        paper = plan_all(s, mode="paper")
        row: dict[str, Any] = {"kv_per_token_bytes": s.wire_kv.per_token_bytes,
                               "kv_fixed_bytes": s.wire_kv.fixed_bytes,
                               "codec": s.wire_codec,
                               "codec_ratio": wire_ratio(s.wire_codec, s.codec_speeds),
                               "flow_cap_gbps": s.flow_cap_gbps,
                               "auto_codec": scenario_with(name, wire, "auto").wire_codec}
        for system in SYSTEMS:
            cfg = build_system(s, system, planned=exact)
            cap = find_capacity(cfg, s.lengths, s.output_tokens, make_arrivals("uniform"),
                                requests=requests, seed=seed,
                                guess_rps=paper.systems[system].lambda_max)
            if label == "bf16":
                caps[system] = cap.max_rps
            row[system] = {"plan_exact": _plan_json(exact.systems[system]),
                           "plan_paper": _plan_json(paper.systems[system]),
                           "sim_capacity_rps": cap.max_rps, "probes": len(cap.probes),
                           "fixed_rate": fixed_rate(s, cfg, FIXED_RATE_SHARE * caps[system],
                                                    requests, seed)}
            print(name, label, system, round(cap.max_rps, 3), flush=True)
        out[label] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = {name: measure(name, args.requests, args.seed) for name in SCENARIOS}
    kimi = geometry(find_model("Kimi-Linear-48B-A3B"))  # = prfaas kv --wire-dtype fp8
    OUT.write_text(json.dumps({
        "what": "plan and simulated capacity/TTFT with bf16 vs fp8_e4m3 KV on the inter-DC "
                "link, each without and with zstd (ratio and rate measured on real KV)",
        "codec_figures": {k: codec_table()[k] for k in ("source", "measured_at")},
        "command": f"PYTHONPATH=src python benchmarks/bench_wire_capacity.py --requests "
                   f"{args.requests}",
        "arrivals": "uniform", "seed": args.seed, "requests": args.requests,
        "fixed_rate_share_of_bf16_capacity": FIXED_RATE_SHARE,
        "kimi_linear_kv_bytes_per_token": {
            "bf16": kimi.kv_bytes_per_token,
            "fp8_e4m3": kimi.on_wire("fp8_e4m3").kv_bytes_per_token,
            "fraction": kimi.on_wire("fp8_e4m3").kv_bytes_per_token / kimi.kv_bytes_per_token},
        "host": platform.node(), "wall_s": round(time.perf_counter() - t0, 1),
        "scenarios": results}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
