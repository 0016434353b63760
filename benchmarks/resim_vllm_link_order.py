"""Committed vLLM sim-vs-live runs re-simulated with the inter-cluster link in each order.

Why: the vLLM connector's SendLink sends one decoder's layers in submit order (one queue per
destination), so a transfer whose prefill starts after another's waits for it; the simulator
shared the link between transfers (processor sharing, the native worker's way) until stop 33
(`link.order`, sim/link.py). For each run given, this rebuilds its workloads (the run's options
and planner capacity, common random numbers: the same prompts lengths and arrivals), its
scenario (the profile embedded in the result), route overheads and core sharing, and simulates
every load with `link.order` shared and fifo. The order the run itself used is recomputed first
and must match its committed `ttft_sim_s` within RECOMPUTE_TOL_S (else the re-simulation is not
the run's simulator and the script stops). Per load: TTFT MAPE overall and by live route for
each order. Also, over all runs: the local-route requests' error by what overlapped them live
(a PrfaaS request's prefill call, its transfer, both, neither), from the per-request arrays and
the router's prefill-call times. Simulator only (no deployment): ~1 min. Writes JSON (default
benchmarks/results/sim_vs_live_vllm_link_order_resim.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resim_vllm_kv_release import _arr, _mape

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = [f"sim_vs_live_vllm_idle_on_deployment_run{k}.json" for k in (1, 2, 3)] + \
    [f"sim_vs_live_vllm_after_series_run{k}.json" for k in (1, 2)] + \
    [f"sim_vs_live_vllm_fifo_link_run{k}.json" for k in (1, 2, 3)]
# the committed per-request figures are rounded to 1e-4 s; the simulator is deterministic,
# so a recompute off by more than this is another simulator or another workload
RECOMPUTE_TOL_S = 2e-3


def resimulate(path: Path, topology: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from prfaas.experiments import sim_vs_live as svl

    r = json.loads(path.read_text())
    max_context = int(topology.vllm.max_model_len)
    options, loads = svl.replay_workloads(r, max_context)
    used = r["sim_config"].get("link_order", "shared")
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.yaml"
        profile.write_text(yaml.safe_dump({k: v for k, v in r["profile"].items()
                                           if k != "path"}))
        raw = svl.scenario_dict(topology, profile, options, max_context)
        # these runs predate the release model (stop 34): re-simulate them as they ran
        raw["link"].pop("release", None)
        out, local = [], []
        for w, entry in zip(loads, r["loads"], strict=True):
            pr = entry["per_request"]
            live, remote = _arr(pr["ttft_live_s"]), np.array(pr["remote_live"], dtype=bool)
            row: dict[str, Any] = {"offered_rps": entry["offered_rps"],
                                   "committed_ttft_mape": entry["ttft_mape"]}
            for order in (used, *(o for o in ("shared", "fifo") if o != used)):
                scen = {**raw, "link": {**raw["link"], "order": order}}
                side, _ = svl.simulate_side(topology, scen, w, int(r["sim_config"]["kv_layers"]),
                                            r["route_overhead_s"], r["core_sharing"])
                if order == used:
                    err = float(np.nanmax(np.abs(side.ttft_s - _arr(pr["ttft_sim_s"]))))
                    if not err <= RECOMPUTE_TOL_S:
                        raise SystemExit(f"{path.name}: recomputed {order} TTFTs differ from "
                                         f"the committed ones by {err:.4f} s")
                    row["recompute_max_abs_err_s"] = round(err, 6)
                row[order] = {"ttft_mape": _mape(side.ttft_s, live, np.ones_like(remote)),
                              "prfaas": _mape(side.ttft_s, live, remote),
                              "pd": _mape(side.ttft_s, live, ~remote)}
            out.append(row)
            sim = _arr(pr["ttft_sim_s"])
            prefill = np.nan_to_num(_arr(pr["prefill_live_router_s"]))
            a = w.arrival_s
            for i in np.flatnonzero(~remote & np.isfinite(live) & np.isfinite(sim)):
                end = a[i] + live[i]
                pre = any(remote[j] and a[j] < end and a[j] + prefill[j] > a[i]
                          for j in range(len(a)))
                xfer = any(remote[j] and a[j] + prefill[j] < end and a[j] + live[j] > a[i]
                           for j in range(len(a)))
                local.append((["neither", "transfer", "prefill", "both"][2 * pre + xfer],
                              float((sim[i] - live[i]) / live[i]), float(live[i] - sim[i])))
    return {"file": path.name, "link_order_used": used, "loads": out}, local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="*", help=f"result files (default: {', '.join(RUNS)})")
    parser.add_argument("--out", default=str(RESULTS / "sim_vs_live_vllm_link_order_resim.json"))
    args = parser.parse_args()
    from prfaas.serve.topology import load_topology

    topology = load_topology(str(ROOT / "topologies" / "vllm-local.yaml"))
    paths = [Path(p) for p in args.runs] or [RESULTS / n for n in RUNS]
    runs, local = [], []
    for path in paths:
        run, rows = resimulate(path, topology)
        runs.append(run)
        local += rows
        print(path.name, "  ".join(
            f"{ld['offered_rps']:.3f}: shared {ld['shared']['ttft_mape']} (PrfaaS "
            f"{ld['shared']['prfaas']}) fifo {ld['fifo']['ttft_mape']} (PrfaaS "
            f"{ld['fifo']['prfaas']})" for ld in run["loads"]))
    by: dict[str, Any] = {}
    for kind in ("neither", "transfer", "prefill", "both"):
        rows = [x for x in local if x[0] == kind]
        if rows:
            rel = np.array([x[1] for x in rows])
            by[kind] = {"requests": len(rows),
                        "abs_rel_err_mean": round(float(np.abs(rel).mean()), 4),
                        "signed_rel_err_mean": round(float(rel.mean()), 4),
                        "live_minus_sim_mean_s": round(float(np.mean([x[2] for x in rows])), 4)}
    doc = {"how": (__doc__ or "").strip(), "recompute_tol_s": RECOMPUTE_TOL_S, "runs": runs,
           "local_route_by_live_overlap": by}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(by, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
