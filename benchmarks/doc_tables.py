"""The generated blocks of the docs: `<!-- table NAME -->` ... `<!-- /table -->`.

Each function takes a loader (results file name, relative to benchmarks/results/ -> its parsed
JSON) and returns the block's markdown; `@table(NAME)` registers it for render_docs.py. A table
prints only what its results files hold: a column with no data behind it stays out of the
generated block (the doc says where such a figure came from).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Loader = Callable[[str], Any]


TableFn = Callable[[Loader], str]  # the block's markdown, without the marker lines
TABLES: dict[str, TableFn] = {}


def table(name: str) -> Callable[[TableFn], TableFn]:
    def register(fn: TableFn) -> TableFn:
        TABLES[name] = fn
        return fn

    return register


def _cells(row: list[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in row) + "|"


@table("serve-policies")
def serve_policies(load: Loader) -> str:
    """README: `prfaas bench` on the local topology, one row per policy (serve.json)."""
    runs = load("serve.json")["runs"]
    label = {"prfaas-threshold": "prfaas-threshold (t=1024)"}
    lines = [
        _cells(["policy", "routes", "TTFT mean / p50 / p90", "TPOT mean / p90",
                "router's own time per request"]),
        "|---|---|---|---|---|",
    ]
    for i, name in enumerate(sorted(runs, key=lambda n: n != "prfaas-threshold")):
        run = runs[name]
        ttft, tpot = run["ttft_s"], run["tpot_s"]
        routes = ", ".join(f"{n} {r}" for r, n in sorted(run["routes"].items(), reverse=True))
        share = f"{run['router_overhead_fraction_of_e2e']['mean']:.2%}"
        lines.append(_cells([
            label.get(name, name),
            routes,
            f"{ttft['mean']:.2f} / {ttft['p50']:.2f} / {ttft['p90']:.2f} s",
            f"{tpot['mean'] * 1e3:.1f} / {tpot['p90'] * 1e3:.1f} ms",
            f"{run['router_overhead_s']['mean'] * 1e3:.1f} ms"
            + (f" ({share} of end to end)" if i == 0 else f" ({share})"),
        ]))
    return "\n".join(lines)


def _s(x: float) -> str:
    """Seconds as the fault tables print them: 3 significant digits, at least 2 decimals."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _fault_label(fault: dict[str, Any], link_gbps: float) -> str:
    d = f"{fault['duration_s']:g} s"
    if fault["kind"] == "partition":
        return f"partition {d}"
    if fault["kind"] == "rate-drop":
        mbit = link_gbps * 1000
        return f"rate {mbit:g} -> {mbit / fault['factor']:g} Mbit/s for {d}"
    if fault["kind"] == "flap":
        return f"flapping {fault['period_s']:g} s down / {fault['period_s']:g} s up, {d}"
    return f"RTT +{fault['delay_ms']:g} ms for {d}"


@table("faults")
def faults(load: Loader) -> str:
    """docs/serving.md: one row per link fault of bench_faults.py (faults.json)."""
    data = load("faults.json")
    rate = data["topology"]["link"]["rate_gbps"]
    lines = [
        _cells(["fault", "sent", "completed", "shed", "lost", "TTFT P50 / P99 (all)",
                "during the window: TTFT P50 / P99, prefilled locally"]),
        "|---|---|---|---|---|---|---|",
    ]
    for f in data["faults"]:
        w = f["during"]
        lines.append(_cells([
            _fault_label(f["fault"], rate), str(f["sent"]), str(f["completed"]), str(f["shed"]),
            str(f["lost"]), f"{_s(f['ttft_p50_s'])} / {_s(f['ttft_p99_s'])} s",
            f"{_s(w['ttft_p50_s'])} / {_s(w['ttft_p99_s'])} s, {w['share_local']:.0%}",
        ]))
    return "\n".join(lines)


@table("faults-rtt-control")
def faults_rtt_control(load: Loader) -> str:
    """docs/serving.md: the RTT fault at 0, 30, 0 ms on one deployment (faults_rtt_control.json)."""
    lines = [
        _cells(["delay", "completed / shed / lost", "TTFT P50 / P99 (all)",
                "during: TTFT P50, local"]),
        "|---|---|---|---|",
    ]
    for f in load("faults_rtt_control.json")["runs"]:
        w = f["during"]
        lines.append(_cells([
            f"{f['fault']['delay_ms']:g} ms", f"{f['completed']} / {f['shed']} / {f['lost']}",
            f"{_s(f['ttft_p50_s'])} / {_s(f['ttft_p99_s'])} s",
            f"{_s(w['ttft_p50_s'])} s, {w['share_local']:.0%}",
        ]))
    return "\n".join(lines)


FAULTS_OUTPUT_TOKENS = 8  # bench_faults.MAX_TOKENS, with ignore_eos: tokens/s = 8 x completions/s


@table("faults-outage")
def faults_outage(load: Loader) -> str:
    """docs/serving.md: the remote outage of bench_faults.py by phase (faults.json)."""
    outage = load("faults.json")["outage"]
    lines = [
        _cells(["phase", "sent", "lost", "TTFT mean / P50 / P90", "completions/s (tokens/s)",
                "prefilled locally"]),
        "|---|---|---|---|---|---|",
    ]
    for name, ph in outage["phases"].items():
        tps = ph["throughput_tokens_per_s"]
        lines.append(_cells([
            f"{name} ({outage[name + '_s']:g} s)", str(ph["sent"]), str(ph["lost"]),
            f"{ph['ttft_mean_s']:.2f} / {ph['ttft_p50_s']:.2f} / {ph['ttft_p90_s']:.2f} s",
            f"{tps / FAULTS_OUTPUT_TOKENS:.1f} ({tps:.1f})", f"{ph['share_local']:.0%}",
        ]))
    return "\n".join(lines)


@table("outage-live-vs-sim")
def outage_live_vs_sim(load: Loader) -> str:
    """docs/serving.md: the case study's link outage live and simulated, by arrival window.

    shed = the window's requests not completed (refused with 429); lost = the run's lost."""
    data = load("live/outage-paper-case-study-run1.json")
    live = data["live"]
    admission = live["default"]["admission"]["max_queued_per_prefill"]
    runs = [("simulator", data["sim"]),
            ("live, no admission limit (as simulated)", live["as_simulated"]),
            (f"live, default admission ({admission} per prefill queue)", live["default"])]
    lines = [
        _cells(["run", "window", "TTFT mean / P50 / P99 s", "first tokens/s",
                "prefilled locally", "shed / lost"]),
        "|---|---|---|---|---|---|",
    ]
    for label, run in runs:
        for i, (name, w) in enumerate(run["windows"].items()):
            t = w["ttft_s"]
            where = f"{name} [{w['start_s']:g}, {w['end_s']:g})" if run is data["sim"] else name
            lines.append(_cells([
                label if i == 0 else "", where,
                f"{_g(t['mean'])} / {_g(t['p50'])} / {_g(t['p99'])}",
                f"{w['first_tokens_per_s']:.2f}", f"{w['local_share']:.0%}",
                f"{w['not_completed']} / {run['lost']}",
            ]))
    return "\n".join(lines)


def _g(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


@table("serve-bench")
def serve_bench(load: Loader) -> str:
    """docs/serving.md: `prfaas bench` on the local topology, with e2e (serve.json)."""
    runs = load("serve.json")["runs"]
    lines = [
        _cells(["policy", "routes", "TTFT mean / p50 / p90", "TPOT mean / p90", "e2e mean",
                "router overhead mean (share of e2e)"]),
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(runs, key=lambda n: n != "prfaas-threshold"):
        run = runs[name]
        ttft, tpot = run["ttft_s"], run["tpot_s"]
        routes = ", ".join(f"{n} {r}" for r, n in sorted(run["routes"].items(), reverse=True))
        lines.append(_cells([
            "prfaas-threshold (t=1024)" if name == "prfaas-threshold" else name, routes,
            f"{ttft['mean']:.2f} / {ttft['p50']:.2f} / {ttft['p90']:.2f} s",
            f"{tpot['mean'] * 1e3:.1f} / {tpot['p90'] * 1e3:.1f} ms",
            f"{run['e2e_s']['mean']:.2f} s",
            f"{run['router_overhead_s']['mean'] * 1e3:.1f} ms "
            f"({run['router_overhead_fraction_of_e2e']['mean']:.2%})",
        ]))
    return "\n".join(lines)


@table("vllm-bench-serve")
def vllm_bench_serve(load: Loader) -> str:
    """docs/serving.md: `vllm bench serve` against the native router (vllm_bench_serve.json)."""
    label = {"openai": "openai (completions)"}
    lines = [
        _cells(["backend", "ok / failed", "routes", "TTFT mean / median / p99",
                "TPOT mean / median / p99", "throughput"]),
        "|---|---|---|---|---|---|",
    ]
    for name, r in load("vllm_bench_serve.json")["results"].items():
        routes = ", ".join(f"{n:g} {k}" for k, n in sorted(r["routes"].items(), reverse=True))
        tokens_per_s = (r["total_input_tokens"] + r["total_output_tokens"]) / r["duration"]
        lines.append(_cells([
            label.get(name, name), f"{r['completed']} / {r['failed']}", routes,
            f"{r['mean_ttft_ms'] / 1e3:.2f} / {r['median_ttft_ms'] / 1e3:.2f} / "
            f"{r['p99_ttft_ms'] / 1e3:.2f} s",
            f"{r['mean_tpot_ms']:.1f} / {r['median_tpot_ms']:.1f} / {r['p99_tpot_ms']:.1f} ms",
            f"{r['request_throughput']:.2f} req/s, {tokens_per_s:.0f} tok/s",
        ]))
    return "\n".join(lines)


SIM_VS_LIVE_RUNS = (1, 2, 3)  # the series docs/sim-vs-live.md cites (results/sim_vs_live/)


def _pct(x: float | None, signed: bool = False) -> str:
    return "—" if x is None else format(x, "+.1%" if signed else ".1%")


def _sim_vs_live_runs(load: Loader, engine: str) -> str:
    lines = [
        _cells(["run", "load: share of capacity (req/s)", "requests", "TTFT MAPE [90% interval]",
                "baseline MAPE", "without overheads", "TTFT P50 / P90 err", "E2E err",
                "throughput live / sim (req/s)", "routes", "verdict"]),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in SIM_VS_LIVE_RUNS:
        run = load(f"sim_vs_live/{engine}_run{k}.json")
        verdicts = run["verdict"]["loads"]
        for i, x in enumerate(run["loads"]):
            ci = x["ttft_mape_ci90"]
            v = verdicts[i]
            lines.append(_cells([
                str(k) if i == 0 else "",
                f"{x['share_of_capacity']:.2f} ({x['offered_rps']:.3f})",
                f"{x['compared']} of {x['requests']}",
                f"{_pct(x['ttft_mape'])} [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "—",
                _pct(x["baseline_ttft_mape"]), _pct(x["ttft_mape_without_route_overheads"]),
                f"{_pct(x['ttft_p50_err'], True)} / {_pct(x['ttft_p90_err'], True)}",
                _pct(x["e2e_mean_err"], True),
                f"{x['throughput_live_rps']:.3f} / {x['throughput_sim_rps']:.3f}",
                f"{x['route_agreement']:.0%}",
                "predicts" if v["predicts"] else "does not"]))
        if "incomplete" in run:
            lines.append(_cells([str(k), f"stopped: {run['incomplete']}", *[""] * 9]))
    return "\n".join(lines)


@table("sim-vs-live-native")
def sim_vs_live_native(load: Loader) -> str:
    """docs/sim-vs-live.md: the native series, every load of every run."""
    return _sim_vs_live_runs(load, "native")


@table("sim-vs-live-vllm")
def sim_vs_live_vllm(load: Loader) -> str:
    """docs/sim-vs-live.md: the vLLM series, every load of every run."""
    return _sim_vs_live_runs(load, "vllm")


@table("sim-vs-live-model")
def sim_vs_live_model(load: Loader) -> str:
    """docs/sim-vs-live.md: each run's fitted constants, and its TTFT MAPE with the whole
    calibration, without the service scale, and on the profile alone."""
    lines = [
        _cells(["backend, run", "prefill x PrfaaS / PD", "overheads PrfaaS / PD (ms)",
                "KV live / sim", "load", "calibrated", "without service scale",
                "profile alone"]),
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine in ("native", "vllm"):
        for k in SIM_VS_LIVE_RUNS:
            run = load(f"sim_vs_live/{engine}_run{k}.json")
            scale, ov = run["service_scale"], run["route_overhead_s"]
            for i, x in enumerate(run["loads"]):
                kv = x["kv_bytes_live_over_sim"]
                head = [f"{engine} {k}", f"{scale['prfaas']:.2f} / {scale['pd']:.2f}",
                        f"{ov['prfaas'] * 1e3:.0f} / {ov['pd'] * 1e3:.0f}",
                        "—" if kv is None else f"{kv['mean']:.3f}"] if i == 0 else [""] * 4
                lines.append(_cells([*head, f"{x['share_of_capacity']:.2f}",
                                     _pct(x["ttft_mape"]),
                                     _pct(x["ttft_mape_without_service_scale"]),
                                     _pct(x["ttft_mape_profile_only"])]))
    return "\n".join(lines)


@table("sim-vs-live-16core")
def sim_vs_live_16core(load: Loader) -> str:
    """docs/sim-vs-live.md: the native command on a 16-core host, 6 cores per deployment
    (results/sim_vs_live/16core_host/, the older code's schema)."""
    lines = [_cells(["run", "requests per load", "TTFT MAPE at 0.25 / 0.5 / 0.75 of capacity",
                     "PrfaaS route at 0.75", "throughput error (max)", "routes (min)"]),
             "|---|---|---|---|---|---|"]
    for k in (1, 2, 3):
        run = load(f"sim_vs_live/16core_host/native_full_run{k}.json")
        loads = run["loads"]
        lines.append(_cells([
            str(k), str(loads[0]["requests"]),
            " / ".join(_pct(x["ttft_mape"]) for x in loads),
            _pct(loads[-1]["ttft_mape_by_live_route"]["prfaas"]),
            _pct(max(x["throughput_rel_err"] for x in loads)),
            f"{min(x['route_agreement'] for x in loads):.0%}"]))
    return "\n".join(lines)


@table("policy-table")
def policy_table(load: Loader) -> str:
    """docs/policies.md: the policy table, means over seeds (policies.json)."""
    lines = [
        _cells(["policy", "throughput (req/s)", "TTFT mean (s)", "P90", "P99", "hit fraction",
                "offload", "egress (Gbps)", "rejected"]),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in load("policies.json")["policy_table"].items():
        m = row["mean"]
        lines.append(_cells([
            name, f"{m['throughput_rps']:.2f}", f"{m['ttft_mean_s']:.2f}",
            f"{m['ttft_p90_s']:.2f}", f"{m['ttft_p99_s']:.2f}",
            f"{m['prefix_hit_fraction']:.3f}", f"{m['offload_fraction']:.2f}",
            f"{m['egress_mean_gbps']:.2f}", f"{m['rejected']:.1f}",
        ]))
    return "\n".join(lines)


@table("link-fluctuation")
def link_fluctuation(load: Loader) -> str:
    """docs/policies.md: the simulated link dip per seed (policies.json)."""
    lf = load("policies.json")["link_fluctuation"]
    t = lf["static_t"] / 1000
    lines = [
        _cells(["policy", "P99 TTFT, arrivals in the dip (s)",
                f"offered egress in the dip (Gbps, capacity {lf['dip_gbps']:g})",
                "P99 TTFT whole run (s)", f"t back within 10% of {t:g}K after recovery (s)"]),
        "|---|---|---|---|---|",
    ]
    for name, run in lf["runs"].items():
        seeds, mean = run["seeds"], run["mean"]
        dip = " / ".join(f"{x['dip_ttft_p99_s']:.1f}" for x in seeds)
        back = [x["t_recovered_after_s"] for x in seeds]
        lines.append(_cells([
            name, f"{dip} (mean {mean['dip_ttft_p99_s']:.1f})",
            " / ".join(f"{x['dip_offered_egress_gbps']:.2f}" for x in seeds),
            f"{mean['ttft_p99_s']:.1f}",
            "— (fixed t)" if None in back else " / ".join(f"{x:g}" for x in back),
        ]))
    return "\n".join(lines)


@table("transport-side-by-side")
def transport_side_by_side(load: Loader) -> str:
    """docs/wire-format.md: four transports at 1/2/4/8 connections (transport.json)."""
    data = load("transport.json")
    runs, ratios = data["unshaped_side_by_side"], data["ratios"]
    lines = [
        _cells(["conn.", "plain socket", "prfaas plaintext (as used: arena)", "ratio",
                "prfaas plaintext, fresh buffers", "ratio", "plain TLS socket",
                "prfaas TLS (as used)", "ratio"]),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, conns in enumerate(ratios["connections"]):
        bold = conns >= 4  # the goal's connection counts

        def ratio(name: str, i: int = i, bold: bool = bold) -> str:
            shown = f"{ratios[name][i]:.2f}"
            fresh = name == "prfaas_plaintext_fresh_over_plain_socket"  # not the goal's
            return f"**{shown}**" if bold and not fresh else shown

        plain = f"{runs['plain_socket'][i]['goodput_gbps']:.2f}"
        lines.append(_cells([
            str(conns), plain + (" Gbps" if i == 0 else ""),
            f"{runs['prfaas_plaintext'][i]['goodput_gbps']:.2f}",
            ratio("prfaas_plaintext_over_plain_socket"),
            f"{runs['prfaas_plaintext_fresh'][i]['goodput_gbps']:.2f}",
            ratio("prfaas_plaintext_fresh_over_plain_socket"),
            f"{runs['plain_tls_socket'][i]['goodput_gbps']:.2f}",
            f"{runs['prfaas_tls'][i]['goodput_gbps']:.2f}",
            ratio("prfaas_tls_over_plain_tls_socket"),
        ]))
    return "\n".join(lines)


_CODEC_SAMPLES = {
    "native_tiny_fp32": "native tiny (KDA:MLA 3:1), float32 (no wire dtype)",
    "native_tiny_bf16": "native tiny, `wire_dtype: bf16`",
    "native_tiny_fp8_e4m3": "native tiny, `wire_dtype: fp8_e4m3` (codes + scales)",
    "vllm_tiny_llama_bf16": "vLLM tiny llama, bf16 KV",
    "vllm_tiny_qwen3_next_bf16": "vLLM tiny qwen3_next, bf16 KV + GDN states",
}


@table("transport-compression")
def transport_compression(load: Loader) -> str:
    """docs/wire-format.md: lossless codecs on real KV (transport.json `compression`)."""
    data = load("transport.json")["compression"]
    lines = [
        _cells(["KV as shipped", "MiB", "zstd ratio", "zstd compress / decompress Gbps",
                "lz4 ratio", "lz4 compress / decompress Gbps", "auto at 1 / 4 / 20.58 Gbps, "
                "4 conn."]),
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for key, label in _CODEC_SAMPLES.items():
        row = data[key]
        z, q, auto = row["codecs"]["zstd"], row["codecs"]["lz4"], row["auto_at_4_connections"]
        lines.append(_cells([
            label, f"{row['bytes'] / 2**20:.1f}", f"{z['ratio']:.3f}",
            f"{z['compress_gbps']:.1f} / {z['decompress_gbps']:.1f}", f"{q['ratio']:.3f}",
            f"{q['compress_gbps']:.1f} / {q['decompress_gbps']:.1f}",
            " / ".join(auto[r] for r in ("1.0", "4.0", "20.58"))]))
    return "\n".join(lines)


@table("sim-startup")
def sim_startup(load: Loader) -> str:
    """docs/simulator.md: whole-process start-up before and after issue 14 (sim.json)."""
    st = load("sim.json")["startup"]
    b, a = st["before"], st["after"]
    rows = [
        (f"`{b['plan']['command']}`", "plan", "process_wall_s"),
        ("of which the grid search it reports", "plan", "work_s"),
        ('`python -c "import prfaas.cli.plan"`', "plan", "import_process_s"),
        (f"`{b['simulate']['command']}`", "simulate", "process_wall_s"),
        ("of which the event loop it reports", "simulate", "work_s"),
        ("outside the loop (interpreter, imports, scenario, plan, output)", "simulate",
         "outside_work_s"),
        ('`python -c "import prfaas.cli.simulate"`', "simulate", "import_process_s"),
    ]
    lines = ["| | before | after |", "|---|---|---|"]
    for label, cmd, key in rows:
        lines.append(_cells([label, f"{b[cmd][key]:.2f} s", f"{a[cmd][key]:.2f} s"]))
    return "\n".join(lines)


@table("planner-reproduction")
def planner_reproduction(load: Loader) -> str:
    """docs/planner.md: the paper-mode plan beside Table 6 (reproduce.json)."""
    data = load("reproduce.json")
    ours, paper = data["planner"]["paper"], data["reference"]
    pp, rp = ours["prfaas_pd"], paper["prfaas_pd"]

    def rel(a: float, b: float, digits: int = 1) -> str:
        return f"{(a / b - 1) * 100:+.{digits}f}%"

    def split(x: dict[str, Any], keys: tuple[str, ...]) -> str:
        return " / ".join(str(x[k]) for k in keys)

    def ttft(x: dict[str, Any]) -> str:
        return f"{x['ttft_mean_s']:.2f} / {x['ttft_p90_s']:.2f} s"

    keys = ("n_prfaas", "n_p", "n_d")
    rows = [
        ["t", f"{pp['threshold_tokens'] / 1000:.1f}K", f"{rp['threshold_tokens'] / 1000:.1f}K",
         rel(pp["threshold_tokens"], rp["threshold_tokens"])],
        ["N_prfaas / N_p / N_d", split(pp, keys), split(rp, keys),
         "exact" if split(pp, keys) == split(rp, keys) else "differs"],
    ]
    for name, label in (("prfaas_pd", "PrfaaS-PD"), ("homogeneous_pd", "homogeneous"),
                        ("naive_heterogeneous", "naive heterogeneous")):
        o, r = ours[name], paper[name]
        split_of = {"homogeneous_pd": ("n_p", "n_d"), "naive_heterogeneous": ("n_prfaas", "n_d")}
        suffix = f" ({split(o, split_of[name])})" if name in split_of else ""
        rows.append([f"Λmax {label}{suffix}", f"{o['lambda_max']:.2f}", f"{r['lambda_max']:.2f}",
                     rel(o["lambda_max"], r["lambda_max"])])
    rows += [
        ["offload fraction", f"{pp['offload_fraction']:.3f}", f"{rp['offload_fraction']:.3f}",
         f"{pp['offload_fraction'] - rp['offload_fraction']:+.3f}"],
        ["E[L \\| L > t]", f"{pp['l_long_tokens'] / 1000:.1f}K",
         f"≈{rp['l_long_tokens'] / 1000:.0f}K", rel(pp["l_long_tokens"], rp["l_long_tokens"], 0)],
        ["egress", f"{pp['egress_gbps']:.1f} Gbps", f"{rp['egress_gbps']:g} Gbps",
         rel(pp["egress_gbps"], rp["egress_gbps"])],
    ]
    for name, label in (("prfaas_pd", "PrfaaS-PD"), ("homogeneous_pd", "homogeneous"),
                        ("naive_heterogeneous", "naive")):
        rows.append([f"TTFT mean / P90 {label}", ttft(ours[name]), ttft(paper[name]), ""])
    return "\n".join(["| | ours | paper | error |", "|---|---|---|---|", *map(_cells, rows)])


_SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")


def _bracket(b: list[float], n: int, digits: int) -> str:
    return f"[{b[0]:.{digits}f}, {b[1]:.{digits}f}] ({n})"


@table("sim-search")
def sim_search(load: Loader) -> str:
    """docs/emulated.md: bench_live_sim_search.py, the live search run in the simulator only."""
    rows = []
    for file, label, short in (
        ("paper-case-study", "paper case study", "paper case study"),
        ("roofline-b200-qwen3-next", "roofline-b200-qwen3-next (time 0.5)",
         "roofline-b200-qwen3-next"),
    ):
        sy = [load(f"live/sim-search-{file}.json")["systems"][n] for n in _SYSTEMS]
        rows.append([f"{label}: search bracket (probes)",
                     *(_bracket(s["sim_bracket_rps"], len(s["sim_probes"]), 2) for s in sy)])
        rows.append([f"{short}: 4000-request search",
                     *(f"{s['sim_capacity_4000_rps']:.2f}" for s in sy)])
    head = ["| | PrfaaS-PD | homogeneous PD | naive heterogeneous |", "|---|---|---|---|"]
    return "\n".join([*head, *map(_cells, rows)])


@table("link-fluctuation-run3")
def link_fluctuation_run3(load: Loader) -> str:
    """docs/emulated.md: the live link-fluctuation run 3, offered vs carried at the link."""
    pol = load("live/link-fluctuation-run3.json")["policies"]
    rows = []
    for name in ("prfaas-threshold", "prfaas-threshold+controller"):
        lv, sm = pol[name]["live"], pol[name]["sim"]
        rows.append([
            f"`{name}`",
            f"{lv['dip_offered_egress_gbps']:.1f} / {sm['dip_offered_egress_gbps']:.1f}",
            f"**{lv['dip_carried_gbps']:.1f} / {sm['dip_carried_gbps']:.1f}**",
            f"{lv['dip_ttft_p99_s']:.1f} / {sm['dip_ttft_p99_s']:.1f}",
            f"{lv['ttft_p99_s']:.1f} / {sm['ttft_p99_s']:.1f}",
        ])
    head = ["| policy | dip KV offered, Gbps: live / sim | **dip bytes carried by the link, "
            "Gbps: live / sim** | dip P99 TTFT s: live / sim | P99 TTFT s: live / sim |",
            "|---|---|---|---|---|"]
    return "\n".join([*head, *map(_cells, rows)])


@table("router-scale")
def router_scale(load: Loader) -> str:
    """docs/simulator.md: bench_router_scale.py, µs per live routing decision, before/after."""
    run = load("router_scale.json")

    def cell(side: str, workers: int, policy: str) -> str:
        row = next(r for r in run[side]["rows"]
                   if r["workers"] == workers and r["policy"] == policy)
        return f"{row['mean_us']:,.1f} ({row['p99_us']:,.1f})"

    rows = [
        [f"{w:,}", *(cell(side, w, p) for p in ("prfaas-threshold", "cache-aware")
                     for side in ("before", "after"))]
        for w in sorted({r["workers"] for r in run["after"]["rows"]})
    ]
    head = ["| workers | prfaas-threshold before | after | cache-aware before | after |",
            "|---|---|---|---|---|"]
    return "\n".join([*head, *map(_cells, rows)])


@table("sim-scale-curve")
def sim_scale_curve(load: Loader) -> str:
    """docs/simulator.md: bench_sim.py --scale (sim.json `scale_curve`), after and before."""
    curve = load("sim.json")["scale_curve"]
    before = {p["instances"]: p for p in curve["before"]["points"]}
    rows = []
    for p in curve["points"]:
        b = before[p["instances"]]
        rows.append([
            f"{p['instances']:,} ({p['n_prfaas']}/{p['n_p']}/{p['n_d']})",
            f"{p['rate_rps']:.3f}",
            f"{p['events']:,}",
            f"{p['wall_s']:g}",
            f"{p['wall_per_request_us']:.1f}",
            f"{p['peak_rss_mib']:.1f}",
            f"{b['wall_s']:.3f}, {b['wall_per_request_us']:.1f}",
        ])
    head = ["| instances (PrfaaS/PD-P/PD-D) | rate (req/s) | events | wall (s) | µs / request | "
            "peak RSS (MiB) | before: wall (s), µs / request |",
            "|---|---|---|---|---|---|---|"]
    return "\n".join([*head, *map(_cells, rows)])


_WIRE_LABEL = {"fp8_e4m3": "fp8_e4m3 (per 16-token block per head: what the wire sends)",
               "bf16 again": "bf16 again (the reference path rerun: its noise floor)",
               "fp8_per_tensor (control)": "fp8, one scale per tensor (coarser)",
               "int4_per_tensor (control)": "int4, one scale per tensor (negative control)",
               "fp8_wrong_scale (control)": "fp8 decoded with twice its scales (negative "
                                            "control)"}


@table("wire-quality")
def wire_quality(load: Loader) -> str:
    """docs/wire-format.md: logprob error of each KV wire variant vs the exact KV (native
    engine, wire_quality.json) or vs bf16 on the wire (vLLM, vllm_wire_quality.json)."""
    data = load("wire_quality.json")
    lines = [_cells(["engine", "KV on the wire",
                     "teacher-forced logprob error mean / p99 / max (nats)",
                     "max error, any token (nats)", "KL mean (nats)", "top-1 agreement",
                     "greedy continuation equal (tokens)"]),
             "|---|---|---|---|---|---|---|"]
    for preset, run in data["presets"].items():
        for name, v in run["variants"].items():
            if name == "exact":
                continue
            e = v["teacher_logprob_abs_err"]
            lines.append(_cells([
                f"{preset}, {run['prompts']} prompts", _WIRE_LABEL.get(name, name),
                f"{e['mean']:.2e} / {e['p99']:.2e} / {e['max']:.2e}",
                f"{v['max_abs_err_logprob_any_token']:.2e}", f"{v['kl_nats_mean']:.1e}",
                f"{v['top1_agreement']:.1%}",
                f"{v['greedy_32_equal_fraction']:.0%} ({data['continuation_tokens']})"]))
    vllm = load("vllm_wire_quality.json")  # top-20 logprobs only: no KL, no any-token error
    for preset, run in vllm["presets"].items():
        for name, v in run["variants"].items():
            e = v["teacher_logprob_abs_err"]
            lines.append(_cells([
                f"{preset}, {run['prompts']} prompts", _WIRE_LABEL.get(name, name),
                f"{e['mean']:.2e} / {e['p99']:.2e} / {e['max']:.2e}", "n/a", "n/a",
                f"{v['top1_agreement']:.1%}",
                f"{v['greedy_equal_fraction']:.0%} ({run['continuation_tokens']})"]))
    return "\n".join(lines)


@table("wire-capacity")
def wire_capacity(load: Loader) -> str:
    """docs/wire-format.md: plan and simulated capacity / TTFT, bf16 vs fp8 KV on the link,
    without and with zstd."""
    data = load("wire_capacity.json")
    lines = [_cells(["scenario", "system", "KV on the wire", "`auto` picks", "plan (exact) req/s",
                     "plan egress Gbps", "plan TTFT mean / p90 s", "sim capacity req/s",
                     "sim TTFT mean / p90 s at the same rate", "dip TTFT mean / p90 s"]),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for scenario, by_wire in data["scenarios"].items():
        systems = [k for k in by_wire["bf16"] if isinstance(by_wire["bf16"][k], dict)]
        for system in systems:
            for wire, row in by_wire.items():
                r = row[system]
                plan, fixed = r["plan_exact"], r["fixed_rate"]
                dip = fixed.get("ttft_dip_s")
                ratio = row.get("codec_ratio", 1.0)
                label = f"{wire} ({ratio:.2f}x)" if row.get("codec", "none") != "none" else wire
                lines.append(_cells([
                    scenario, system, label, row.get("auto_codec", ""),
                    f"{plan['lambda_max']:.2f}",
                    f"{plan['egress_gbps']:.1f}" if plan["egress_gbps"] is not None else "",
                    f"{plan['ttft_mean_s']:.2f} / {plan['ttft_p90_s']:.2f}",
                    f"{r['sim_capacity_rps']:.2f}",
                    f"{fixed['ttft_s']['mean']:.2f} / {fixed['ttft_s']['p90']:.2f} "
                    f"({fixed['rate_rps']:.2f} req/s)",
                    f"{dip['mean']:.2f} / {dip['p90']:.2f}" if dip else ""]))
    return "\n".join(lines)


@table("regions-live-capacity")
def regions_live_capacity(load: Loader) -> str:
    """docs/multi-region.md: bench_regions_live.py --only capacity, one row per live probe
    with the simulator's verdict and figures on the same requests."""
    cap = load("regions_live.json")["capacity"]
    plan = cap["planned_rps"]

    def verdict(regions: dict[str, Any]) -> str:
        return ", ".join(f"{k} {'ok' if r['sustained'] else 'over'}" for k, r in regions.items())

    def pair(p: dict[str, Any], k: str, key: str, digits: int) -> str:
        def get(r: dict[str, Any]) -> str:
            v = r[key] if key != "ttft_p90" else r["ttft_s"].get("p90")
            return "-" if v is None else f"{v:.{digits}f}"

        return f"{get(p['regions'][k])} / {get(p['sim_regions'][k])}"

    rows = []
    for i, p in enumerate(cap["live"]["probes"]):
        x = p["scale"]
        rows.append([f"{i + 1}", f"{x:.4g}", " / ".join(f"{x * v:.3f}" for v in plan.values()),
                     verdict(p["regions"]), verdict(p["sim_regions"]),
                     *(pair(p, k, "ready_throughput_rps", 3) for k in plan),
                     *(pair(p, k, "ttft_p90", 1) for k in plan)])
    names = list(plan)
    head = ["probe", "x (of plan)", f"offered {' / '.join(names)} (req/s)", "live verdict",
            "simulator verdict, same requests",
            *(f"{k} ready throughput live / sim" for k in names),
            *(f"{k} TTFT P90 live / sim (s)" for k in names)]
    return "\n".join([_cells(head), "|" + "---|" * len(head), *map(_cells, rows)])


@table("alert-drill")
def alert_drill(load: Loader) -> str:
    """docs/operate.md: the live alert drill, one row per alert seen (alert_drill.json)."""
    result = load("alert_drill.json")
    lines = [_cells(["fault", "alert", "about", "pending at", "firing at", "fault over at",
                     "resolved at"]), "|---|---|---|---|---|---|---|"]
    for phase in result["phases"]:
        alerts = phase["alerts"] or [None]
        for a in alerts:
            if a is None:
                lines.append(_cells([phase["phase"], "none", "", "", "", "", ""]))
                continue
            about = a["labels"].get("worker") or ("inter-DC link" if a["alertname"] ==
                                                  "PrfaasLinkDown" else result["targets"].get(
                a["labels"].get("instance", ""), ""))
            end = phase["fault_end_s"]
            lines.append(_cells([
                phase["phase"], a["alertname"], about, f"{a['pending_s']:.1f} s",
                "-" if a["firing_s"] is None else f"{a['firing_s']:.1f} s",
                "-" if end is None else f"{end:.1f} s",
                "-" if a["resolved_s"] is None else f"{a['resolved_s']:.1f} s"]))
    return "\n".join(lines)

@table("shape-phases")
def shape_phases(load: Loader) -> str:
    """docs/shape.md: bench_shape_live.py, per phase: throughput and TTFT P50 / P90 with the
    shape fixed and with the controller, live and simulated (live units)."""
    data = load("shape.json")

    def cell(run: dict[str, Any]) -> list[str]:
        return [f"{run['throughput_rps']:.2f}",
                f"{run['ttft_p50_s']:.2f} / {run['ttft_p90_s']:.2f}"]

    rows = []
    for ph in data["phases"]:
        for side in ("live", "sim"):
            if side not in ph:
                continue
            runs = ph[side]
            rows.append([ph["name"] if side == "live" else "", side,
                         *cell(runs["fixed"]), *cell(runs["controlled"])])
    head = ["phase", "", "fixed: req/s", "fixed: TTFT P50 / P90 (s)", "controlled: req/s",
            "controlled: TTFT P50 / P90 (s)"]
    return "\n".join([_cells(head), "|" + "---|" * len(head), *map(_cells, rows)])


@table("shape-changes")
def shape_changes(load: Loader) -> str:
    """docs/shape.md: every role change of the benchmark's controlled runs, live and
    simulated (when, which instance, roles, drain seconds; live: the restart seconds)."""
    data = load("shape.json")
    rows = []
    for side, key in (("live", "role_changes"), ("sim", "sim_role_changes")):
        for c in data.get(key) or []:
            restart = c.get("restart_s")
            rows.append([side, f"{c['at_s']:.1f}", c["instance"], f"{c['from']} -> {c['to']}",
                         "-" if c.get("drain_s") is None else f"{c['drain_s']:.1f}",
                         "-" if restart is None else f"{restart:.1f}"])
    head = ["run", "at (s)", "instance", "role", "drain (s)", "restart (s)"]
    return "\n".join([_cells(head), "|" + "---|" * len(head), *map(_cells, rows)])


LIVE_SEEDS = ("live/paper-case-study-seed0.json", "live/paper-case-study-seed1.json",
              "live/paper-case-study-seed2.json")
LIVE_CONTROL = "live/paper-case-study-slower-seed0.json"  # workers 5% slower than the profile


def _lo(b: list[float | None]) -> str:
    return "—" if b[0] is None else f"{b[0]:.2f}"


def _ends(edges: dict[str, Any]) -> str:
    """The margins (requests) of the verdicts at a bracket's two ends: `+a / -b of n`."""
    cells = []
    for key in ("sustained", "unsustained"):
        e = edges.get(key)
        cells.append("—" if not e else f"{e['margin_requests']:+.0f}")
    n = max((e["requests"] for e in edges.values() if e), default=0)
    return f"{' / '.join(cells)} of {n}"


@table("live-capacity")
def live_capacity(load: Loader) -> str:
    """README headline and docs/emulated.md: `prfaas reproduce --live --quick` on the paper
    case study, seeds 0, 1 and 2 (each a short search then its bracket judged again on long
    probes), each system's capacity live and simulated on the same probe workloads, the margin
    in requests of the verdicts at the live bracket's ends, and the negative control (seed 0,
    the emulated workers 5% slower than the profile the router and simulator use)."""
    runs = [load(f) for f in LIVE_SEEDS]
    control = load(LIVE_CONTROL)
    paper = load("reproduce.json")["reference"]

    def per_seed(fn: Any) -> list[str]:
        return [" / ".join(fn(r["systems"][n], r) for r in runs) for n in _SYSTEMS]

    def ratio(s: dict[str, Any], r: dict[str, Any]) -> str:
        return "—" if s is r["systems"]["homogeneous_pd"] else \
            f"{r['live_ratios'][_name(r, s)]:.2f}x"

    ctl = [control["systems"][n] for n in _SYSTEMS]
    base = [runs[0]["systems"][n] for n in _SYSTEMS]
    rows = [
        ["paper Table 6 Λmax (req/s)", *(f"{paper[n]['lambda_max']:.2f}" for n in _SYSTEMS)],
        ["simulator, 4000-request search", *(f"{s['sim_capacity_4000_rps']:.2f}"
                                             for s in base)],
        ["simulator, the live search (seeds 0 / 1 / 2)",
         *per_seed(lambda s, r: _lo(s["sim_bracket_rps"]))],
        ["**live, emulated** (seeds 0 / 1 / 2)",
         *per_seed(lambda s, r: f"**{_lo(s['bracket_rps'])}**")],
        ["live / simulator, same probes", *per_seed(
            lambda s, r: "—" if s["live_over_sim"] is None else f"{s['live_over_sim']:.2f}")],
        ["margin at the live bracket's ends, requests (seed 0)",
         *(_ends(s["bracket_margins"]) for s in base)],
        ["throughput ratio over homogeneous PD, live", *per_seed(ratio)],
        ["**control**, workers 5% slower (seed 0): live (simulator)",
         *(f"**{_lo(c['bracket_rps'])}** ({_lo(c['sim_bracket_rps'])})" for c in ctl)],
    ]
    head = ["| | PrfaaS-PD | homogeneous PD | naive heterogeneous |", "|---|---|---|---|"]
    return "\n".join([*head, *map(_cells, rows)])


def _name(run: dict[str, Any], system: dict[str, Any]) -> str:
    return next(n for n, s in run["systems"].items() if s is system)


def _br(b: list[float | None]) -> str:
    lo, hi = ("—" if v is None else f"{v:.3f}" for v in b)
    return f"[{lo}, {hi}]"


@table("live-capacity-detail")
def live_capacity_detail(load: Loader) -> str:
    """docs/emulated.md: per seed and system, the short and the confirmed brackets live and
    simulated, the margins at the confirmed live bracket's ends, and how often the simulator
    gave the live verdict on the same long probe's workload (plus the control run)."""
    lines = [_cells(["run", "system", "short bracket live / sim", "confirmed bracket live / sim",
                     "live margins at the ends (requests)", "long probes: live, same verdict "
                     "as the simulator", "max CPU share"]),
             "|---|---|---|---|---|---|---|"]
    label = {"prfaas_pd": "PrfaaS-PD", "homogeneous_pd": "homogeneous PD",
             "naive_heterogeneous": "naive heterogeneous"}
    for file in (*LIVE_SEEDS, LIVE_CONTROL):
        run = load(file)
        name = f"seed {run['seed']}" + (", workers 5% slower" if file == LIVE_CONTROL else "")
        for n in _SYSTEMS:
            s = run["systems"][n]
            long = s["confirm_probes"]
            same = sum(p["sustained"] == p["sim_same_workload"]["sustained"] for p in long)
            lines.append(_cells([
                name, label[n],
                f"{_br(s['short_bracket_rps'])} / {_br(s['sim_short_bracket_rps'])}",
                f"{_br(s['bracket_rps'])} / {_br(s['sim_bracket_rps'])}",
                _ends(s["bracket_margins"]), f"{len(long)}, {same}",
                f"{s['max_cpu_share']:.0%}"]))
    return "\n".join(lines)


def _over(windows: list[float], limit: float) -> int:
    return sum(w > limit for w in windows)


@table("regions-budget")
def regions_budget(load: Loader) -> str:
    """docs/multi-region.md: bench_regions_live.py --only budget, per run and destination: its
    budget, the picks it was held at, its link's bytes metered, its windows against the budget,
    live and simulated on the same requests (regions_live.json, key `budget`)."""
    data = load("regions_live.json")["budget"]
    lines = [_cells(["run", "destination", "budget (Gbps)", "held: live / sim",
                     "link bytes (GB): host end / gateway meter / KV reported",
                     "10 s windows: max Gbps live / sim",
                     "windows above the budgeted run's budget: live / sim",
                     "TTFT P90 s: live / sim", "offload live / sim"]),
             "|---|---|---|---|---|---|---|---|---|"]
    label = {"budget": "near budgeted", "control_no_budget": "control, no budget"}
    for key, run in data["runs"].items():
        for dest, r in run["regions"].items():
            lv, sm = r["live"], r["sim"]
            # the control's windows are held to the budgeted run's figure for that destination
            limit = data["budget_gbps"] if dest == data["destination"] else r["budget_gbps"]
            gb = [x / 1e9 for x in (lv["link_bytes_host_end"], lv["link_bytes_gateway_meter"],
                                    lv["kv_bytes_reported"])]
            lines.append(_cells([
                label.get(key, key), dest, f"{r['budget_gbps']:.1f}",
                f"{lv['budget_held']:.0f} / {sm['budget_held']}",
                " / ".join(f"{x:.1f}" for x in gb),
                f"{lv['max_gbps']:.2f} / {sm['max_gbps']:.2f}",
                f"{_over(lv['window_gbps'], limit)} of {lv['windows']} / "
                f"{_over(sm['window_gbps'], limit)} of {sm['windows']}",
                f"{lv['ttft_p90_s']:.1f} / {sm['ttft_p90_s']:.1f}",
                f"{lv['offload_fraction']:.2f} / {sm['offload_fraction']:.2f}"]))
    return "\n".join(lines)
