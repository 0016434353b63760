"""`prfaas plan`: the throughput model and its grid search for a scenario."""

from __future__ import annotations

import time
from pathlib import Path

import click

from prfaas.cli.common import console, echo_json
from prfaas.planner.report import plan_json, plan_table
from prfaas.planner.search import inputs_from_scenario, plan_all
from prfaas.scenario import load_scenario


@click.command("plan")
@click.option("--scenario", "scenario_name", default="paper-case-study", show_default=True,
              help="Built-in scenario name or a YAML path.")
@click.option("--mode", type=click.Choice(["paper", "exact"]), default=None,
              help="paper: T(E[L]) as the paper; exact: E[T(L)] (default: the scenario's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--objective", type=click.Choice(["throughput", "fair"]), default="throughput",
              show_default=True, help="With several PD clusters: total throughput, or the "
              "weighted fair share (docs/multi-region.md).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write the two panels of Figure 5 as PNG into this folder.")
def command(scenario_name: str, mode: str | None, as_json: bool, plot_dir: str | None,
            objective: str = "throughput") -> None:
    """Optimal threshold t, N_p:N_d split, capacity and egress of the three systems."""
    scenario = load_scenario(scenario_name)
    if scenario.pd_clusters:
        from prfaas.cli.regions import plan_command

        plan_command(scenario, mode, objective, as_json)
        return
    start = time.perf_counter()
    result = plan_all(scenario, mode)
    elapsed = time.perf_counter() - start
    paths: list[Path] = []
    if plot_dir:
        from prfaas.planner.figures import figure5  # matplotlib only when drawing

        paths = figure5(inputs_from_scenario(scenario), result.systems["prfaas_pd"],
                        result.mode, Path(plot_dir))
    if as_json:
        payload = plan_json(result)
        payload["scenario"] = scenario.name
        echo_json(payload)
        return
    console.print(plan_table(result, scenario.reference))
    prf = result.systems["prfaas_pd"]
    console.print(f"PrfaaS cluster is {prf.extra.get('prfaas_limited_by')}-bound; "
                  f"TTFT figures are queue-free service times (prefill + KV transfer on an idle "
                  f"link), as the paper's; see `prfaas simulate` for queueing.")
    console.print(f"searched {result.search_points:,} (t, N_p) points in {elapsed * 1000:.0f} ms")
    for p in paths:
        console.print(f"wrote {p}")
