"""`prfaas reproduce`: the paper's case study end to end (what `make demo` runs).

Prints the planner table beside the paper's Table 6, the simulated capacity of each system, and
TTFT under queueing at one common load and at 90% of each system's own capacity; writes PNG
plots and results.json into --out.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.progress import Progress
from rich.table import Table

from prfaas.cli.common import console, dumps
from prfaas.core.errors import ConfigError
from prfaas.planner.report import plan_table
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario
from prfaas.sim.reproduce import STEPS, reproduce
from prfaas.sim.system import SYSTEMS


@click.command("reproduce")
@click.option("--scenario", "scenario_name", default="paper-case-study", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/reproduce",
              show_default=True, help="Folder for plots and results.json.")
@click.option("--live", is_flag=True, help="Run every system live on emulated hardware "
              "(prfaas.emulated) beside the simulator; writes live.json and live_vs_sim.png.")
@click.option("--quick", is_flag=True, help="With --live: fewer, shorter probes (~15 min).")
@click.option("--scales", "scales_text", default=None, metavar="time=A,bytes=B,tokens=D,output=G",
              help="With --live: the emulation's unit scales (docs/emulated.md).")
@click.option("--keep-logs", is_flag=True, help="With --live: keep worker logs in OUT/logs.")
@click.option("--link-fluctuation", "fluctuation", is_flag=True,
              help="With --live: the link drops 10x mid-run and recovers, static t vs the "
              "controller (needs root for the shared netns link); writes fluctuation.json.")
@click.option("--outage", "outage_text", default=None, metavar="link@START+DURATION",
              help="With --live: PrfaaS-PD with the inter-DC link partitioned for DURATION "
              "scenario seconds from START, beside `simulate --outage` of the same run (needs "
              "root); writes outage.json.")
@click.option("--load", type=float, default=0.7, show_default=True,
              help="With --outage: offered load, a fraction of the planner's capacity.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --live: the probe workloads' seed (repeat a search on others).")
@click.option("--control-slowdown", type=click.FloatRange(1.0, 10.0), default=1.0,
              show_default=True, help="With --live, a negative control: the emulated workers "
              "run this factor slower than the profile the router and the simulator use, so "
              "the live capacity must fall and the simulator's stay.")
def command(scenario_name: str, out_dir: str, live: bool, quick: bool,
            scales_text: str | None, keep_logs: bool, fluctuation: bool,
            outage_text: str | None, load: float, seed: int,
            control_slowdown: float) -> None:
    """Planner, simulated capacities, TTFT under load and plots for the case study."""
    started = time.perf_counter()
    scenario = load_scenario(scenario_name)
    if outage_text and not live:
        raise ConfigError("--outage", outage_text, "needs --live (the simulated outage is "
                          "`prfaas simulate --outage`)")
    if (seed or control_slowdown != 1.0) and (not live or scenario.pd_clusters
                                              or outage_text or fluctuation):
        raise ConfigError("--seed/--control-slowdown", (seed, control_slowdown),
                          "apply to `reproduce --live`'s capacity search of a one-PD-cluster "
                          "scenario only")
    if scenario.pd_clusters:
        if live:
            from prfaas.cli.regions import reproduce_live_command

            reproduce_live_command(scenario_name, Path(out_dir), quick, scales_text)
            return
        from prfaas.cli.regions import reproduce_command

        reproduce_command(scenario, Path(out_dir))
        return
    if live and outage_text:
        from prfaas.experiments.report import run_outage_command

        run_outage_command(scenario, Path(out_dir), outage_text, load, scales_text)
        return
    if live and fluctuation:
        from prfaas.experiments.report import run_fluctuation_command

        run_fluctuation_command(Path(out_dir), scales_text)
        return
    if live:
        from prfaas.experiments.report import run_live_command

        run_live_command(scenario, Path(out_dir), quick, scales_text, keep_logs, seed,
                         control_slowdown)
        return
    folder = Path(out_dir)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("reproducing", total=STEPS)

        def tick(label: str) -> None:
            progress.update(task, advance=1, description=label)

        result = reproduce(scenario, folder, tick)
    console.print(plan_table(plan_all(scenario, mode=scenario.mode), scenario.reference))
    console.print(_sim_table(result))
    result["wall_s"] = round(time.perf_counter() - started, 2)
    (folder / "results.json").write_text(dumps(result) + "\n")
    console.print("TTFT here is measured under queueing (uniform arrivals, "
                  f"{result['requests_per_run']} requests); the paper's Table 6 TTFT is "
                  "queue-free service time.")
    console.print(f"wrote {', '.join(result['plots'])} and results.json to {folder} "
                  f"in {result['wall_s']} s")


def _ttft(run: dict[str, Any]) -> str:
    t = run["ttft_s"]
    return f"{t['mean']:.2f} / {t['p90']:.2f} / {t['p99']:.2f}"


def _sim_table(result: dict[str, Any]) -> Table:
    table = Table(title="Simulation (uniform arrivals); paper's Table 6 in parentheses")
    table.add_column("")
    for name in SYSTEMS:
        table.add_column(name, justify="right")
    ref, cap, runs = result["reference"], result["capacity"], result["runs"]
    exact = result["planner"]["exact"]
    paper = result["planner"]["paper"]
    table.add_row("simulated capacity (req/s)", *[
        f"{cap[n]['max_rps']:.2f} ({ref.get(n, {}).get('lambda_max', '—')})" for n in SYSTEMS])
    table.add_row("vs planner exact", *[
        f"{cap[n]['max_rps'] / exact[n]['lambda_max'] - 1:+.1%}" for n in SYSTEMS])
    table.add_row("planner paper-mode over sim", *[
        f"{paper[n]['lambda_max'] / cap[n]['max_rps'] - 1:+.1%}" for n in SYSTEMS])
    base = cap["homogeneous_pd"]["max_rps"]
    table.add_row("throughput ratio", *[f"{cap[n]['max_rps'] / base:.2f}x" for n in SYSTEMS])
    table.add_row(f"TTFT mean/P90/P99 s at {result['common_rps']} req/s",
                  *[_ttft(runs[n]["common"]) for n in SYSTEMS])
    table.add_row("TTFT mean/P90/P99 s at 90% own capacity", *[
        _ttft(runs[n]["own90"]) + (f" ({ref[n]['ttft_mean_s']} / {ref[n]['ttft_p90_s']})"
                                   if "ttft_mean_s" in ref.get(n, {}) else "")
        for n in SYSTEMS])
    table.add_row("offload fraction at 90%", *[
        f"{runs[n]['own90']['offload_fraction']:.3f}" for n in SYSTEMS])
    table.add_row("egress mean / P99 Gbps at 90%", *[
        f"{runs[n]['own90']['egress_gbps']['mean']:.1f} / "
        f"{runs[n]['own90']['egress_gbps']['p99']:.1f}" for n in SYSTEMS])
    return table
