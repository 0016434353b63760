"""`prfaas reproduce --live`: progress bar, the table printed at the end, live.json and the
plot. Every input (scenario, scales, each system's topology) is checked before a process
starts, so bad input is one line and exit code 2."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from prfaas.core.console import console
from prfaas.emulated.cli import parse_scales
from prfaas.emulated.topology import emulated_system
from prfaas.experiments.live import FULL, QUICK, STEPS_PER_SYSTEM, SYSTEMS, reproduce_live
from prfaas.experiments.plots import live_vs_sim
from prfaas.scenario import Scenario


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every deployment's processes and namespace are removed."""
    def handler(signum: int, _: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)


def run_live_command(scenario: Scenario, out_dir: Path, quick: bool, scales_text: str | None,
                     keep_logs: bool, seed: int = 0, control_slowdown: float = 1.0) -> None:
    _stop_on_sigterm()
    started = time.perf_counter()
    scales = parse_scales(scales_text)
    for name in SYSTEMS:
        # bad scales / hardware / control factor fail here, in one line
        emulated_system(scenario, name, scales, control_slowdown=control_slowdown)
    options = QUICK if quick else FULL
    load0 = os.getloadavg()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("live reproduction", total=len(SYSTEMS) * STEPS_PER_SYSTEM + 3)

        def tick(label: str) -> None:
            progress.update(task, advance=1, description=label)
            if not console.is_terminal:  # a log file gets one line per step instead
                console.print(f"[{time.perf_counter() - started:6.0f} s] {label}")

        result = reproduce_live(scenario, out_dir, options, scales, tick, keep_logs, seed,
                                control_slowdown)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["loadavg_start_end"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    result["machine"] = {"cpus": os.cpu_count()}
    plot = live_vs_sim(result, out_dir / "live_vs_sim.png")
    (out_dir / "live.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(live_table(result))
    console.print(f"wrote live.json and {plot.name} to {out_dir} in {result['wall_s']} s "
                  f"(load average {result['loadavg_start_end'][0]} -> "
                  f"{result['loadavg_start_end'][1]})")


def _ttft(run: dict[str, Any] | None, side: str) -> str:
    if not run:
        return "—"
    t = run[side]["ttft_s"]
    return f"{t.get('mean', float('nan')):.2f} / {t.get('p50', float('nan')):.2f} / " \
           f"{t.get('p90', float('nan')):.2f}"


def live_table(result: dict[str, Any]) -> Table:
    sc = result["scales"]
    control = result.get("control_slowdown", 1.0)
    table = Table(title=f"{result['scenario']}: live (emulated hardware) vs simulator, "
                        f"scenario units (scales time {sc['time']}, bytes {sc['bytes']}, "
                        f"tokens {sc['tokens']}, output {sc['output']}), seed "
                        f"{result.get('seed', 0)}"
                        + (f"; CONTROL: workers {control}x slower than the profile"
                           if control != 1.0 else ""))
    table.add_column("")
    for name in SYSTEMS:
        table.add_column(name, justify="right")
    s = result["systems"]

    def bracket(key: str, n: str) -> str:
        lo, hi = s[n][key]
        return "—" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"

    def num(v: float | None, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    def margins(key: str, n: str) -> str:
        edges = s[n].get(key) or {}
        return " / ".join("—" if not edges.get(e) else f"{edges[e]['margin_requests']:+.1f} "
                          f"of {edges[e]['requests']}" for e in ("sustained", "unsustained"))

    rows: list[tuple[str, list[str]]] = [
        ("live capacity (req/s)", [num(s[n]["live_capacity_rps"], ".3f") for n in SYSTEMS]),
        ("live bracket, probes (+ long)", [
            f"{bracket('bracket_rps', n)}, {len(s[n]['probes'])} "
            f"(+{len(s[n].get('confirm_probes', []))})" for n in SYSTEMS]),
        ("live margins at the ends (requests)", [margins("bracket_margins", n)
                                                 for n in SYSTEMS]),
        ("sim capacity, same search", [num(s[n]["sim_capacity_rps"], ".3f") for n in SYSTEMS]),
        ("sim bracket, probes (+ long)", [
            f"{bracket('sim_bracket_rps', n)}, {len(s[n]['sim_probes'])} "
            f"(+{len(s[n].get('sim_confirm_probes', []))})" for n in SYSTEMS]),
        ("sim margins at the ends (requests)", [margins("sim_bracket_margins", n)
                                                for n in SYSTEMS]),
        ("live / sim", [num(s[n]["live_over_sim"], ".3f") for n in SYSTEMS]),
        ("sim capacity, 4000 requests", [f"{s[n]['sim_capacity_4000_rps']:.3f}"
                                         for n in SYSTEMS]),
        ("throughput ratio live (sim)", [f"{num(result['live_ratios'][n], '.2f')}x "
                                         f"({num(result['sim_ratios'][n], '.2f')}x)"
                                         for n in SYSTEMS]),
    ]
    for label, key in ((f"TTFT mean/P50/P90 s at {result['common_rps']:.3f} req/s",
                        "ttft_common"), ("TTFT at 90% own capacity", "ttft_own90"),
                       ("TTFT at 70% own capacity", "ttft_own70")):
        if not any(s[n][key] for n in SYSTEMS):
            continue
        rows.append((f"{label}, live", [_ttft(s[n][key], "live") for n in SYSTEMS]))
        rows.append((f"{label}, sim", [_ttft(s[n][key], "sim") for n in SYSTEMS]))
    own = "ttft_own90" if any(s[n]["ttft_own90"] for n in SYSTEMS) else "ttft_own70"
    rows.append((f"egress Gbps at {own[-2:]}%, live / sim", [
        f"{s[n][own]['live_egress_gbps']:.1f} / {s[n][own]['sim_egress_gbps']:.1f}"
        if s[n][own] else "—" for n in SYSTEMS]))
    rows.append(("max CPU share of our processes", [f"{s[n]['max_cpu_share']:.0%}"
                                                    for n in SYSTEMS]))
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


def run_fluctuation_command(out_dir: Path, scales_text: str | None) -> None:
    from prfaas.experiments.fluctuation import fluctuation_live

    _stop_on_sigterm()
    started = time.perf_counter()
    scales = parse_scales(scales_text)
    out_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]

    def tick(label: str) -> None:
        console.print(f"[{time.perf_counter() - started:6.0f} s] {label}")

    result = fluctuation_live(scales, tick=tick)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["loadavg_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    (out_dir / "fluctuation.json").write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"link {result['link_gbps']} -> {result['dip_gbps']} -> "
                        f"{result['link_gbps']} Gbps (scenario units), {result['rate_rps']} "
                        "req/s; live = emulated hardware")
    for col in ("policy", "dip offered KV Gbps live / sim", "dip P99 TTFT s live / sim",
                "P99 TTFT s live / sim", "dip offload live / sim"):
        table.add_column(col, justify="right")
    for policy, r in result["policies"].items():
        lv, sm = r["live"], r["sim"]
        table.add_row(policy, f"{lv['dip_offered_egress_gbps']:.1f} / "
                      f"{sm['dip_offered_egress_gbps']:.1f}",
                      f"{lv['dip_ttft_p99_s']:.2f} / {sm['dip_ttft_p99_s']:.2f}",
                      f"{lv['ttft_p99_s']:.2f} / {sm['ttft_p99_s']:.2f}",
                      f"{lv['dip_offload_fraction']:.2f} / {sm['dip_offload_fraction']:.2f}")
    console.print(table)
    console.print(f"wrote fluctuation.json to {out_dir} in {result['wall_s']} s")


def run_outage_command(scenario: Scenario, out_dir: Path, outage_text: str, load: float,
                       scales_text: str | None) -> None:
    from prfaas.experiments.outage import outage_live
    from prfaas.sim.outages import parse_outage

    _stop_on_sigterm()
    started = time.perf_counter()
    outage, scales = parse_outage(outage_text), parse_scales(scales_text)
    out_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]

    def tick(label: str) -> None:
        console.print(f"[{time.perf_counter() - started:6.0f} s] {label}")

    result = outage_live(outage, scales, load, scenario.name, tick)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["loadavg_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    (out_dir / "outage.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(outage_table(result))
    for label, run in result["live"].items():
        if run["shed"] or run["lost"]:
            console.print(f"live, {label}: {run['shed']} shed (429/503, never accepted), "
                          f"{run['lost']} lost; e.g. {'; '.join(run['error_samples'])[:300]}")
    console.print(f"wrote outage.json to {out_dir} in {result['wall_s']} s")


def outage_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"{result['scenario']} PrfaaS-PD, link down {result['outage']} at "
                        f"{result['rate_rps']} req/s ({result['load']:.0%} of the planner's "
                        f"{result['planner_capacity_rps']}); scenario units; live = emulated "
                        "hardware")
    for col in ("run", "window", "TTFT mean s", "TTFT P99 s", "first tokens/s", "local share",
                "not completed"):
        table.add_column(col, justify="right")

    def one(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    runs = {"simulator": result["sim"], **{f"live, {k}": v for k, v in result["live"].items()}}
    for label, run in runs.items():
        for name in ("before", "during", "after"):
            w = run["windows"][name]
            table.add_row(label if name == "before" else "",
                          f"{name} [{w['start_s']:g}, {w['end_s']:g})",
                          one(w["ttft_s"]["mean"], ".2f"), one(w["ttft_s"]["p99"], ".2f"),
                          one(w["first_tokens_per_s"], ".2f"), one(w["local_share"], ".2f"),
                          str(w["not_completed"]))
    return table
