"""`prfaas capacity`: the highest sustainable offered rate of a system, by simulation."""

from __future__ import annotations

from typing import Any

import click

from prfaas.cli.common import console, echo_json
from prfaas.cli.simulate import config_from, system_options
from prfaas.core.errors import ConfigError
from prfaas.planner.search import plan_all
from prfaas.scenario import load_scenario
from prfaas.sim.capacity import CapacityResult, Probe, find_capacity, search_rates
from prfaas.workload.arrivals import make_arrivals

REL_TOL, MAX_PROBES = 0.005, 24  # the search's bounds, local or on Ray


@click.command("capacity")
@system_options
@click.option("--requests", type=int, default=4000, show_default=True,
              help="Requests per probe (same seed at every rate).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run the probes as tasks on the Ray cluster at ADDRESS (speculatively "
              "ahead, in parallel); the result is the local one (docs/deploy.md).")
def command(scenario_name: str, system: str, threshold: int | None, n_p: int | None,
            n_d: int | None, link_gbps: float | None, no_pipeline: bool, prefill_order: str,
            arrivals: str, seed: int, requests: int, as_json: bool,
            ray_address: str | None) -> None:
    """Search the offered rate: sustainable = throughput >= 98% of offered, no growing queue."""
    scenario = load_scenario(scenario_name)
    if scenario.pd_clusters and ray_address is not None:
        raise ConfigError("--ray", ray_address, f"{scenario.name} has several PD clusters, "
                          "whose capacity search runs locally only; drop --ray")
    if scenario.pd_clusters:  # several PD clusters: along the plan's mix, PrfaaS-PD with DRR
        from prfaas.cli.regions import capacity_command

        capacity_command(scenario, "drr", "throughput", requests, seed, arrivals, as_json)
        return
    process = make_arrivals(arrivals)
    scenario, cfg, planned = config_from(scenario_name, system, threshold, n_p, n_d, link_gbps,
                                         no_pipeline, prefill_order)
    exact = planned.systems[system].lambda_max
    paper = plan_all(scenario, mode="paper").systems[system].lambda_max
    if ray_address is None:
        result = find_capacity(cfg, scenario.lengths, scenario.output_tokens, process,
                               requests=requests, seed=seed, guess_rps=paper, rel_tol=REL_TOL,
                               max_probes=MAX_PROBES)
    else:
        result = _on_ray(ray_address, cfg, scenario, process, requests, seed, paper)
    payload = result.to_json()
    payload.update({"arrivals": arrivals, "seed": seed, "requests": requests,
                    "planner_exact_rps": round(exact, 4), "planner_paper_rps": round(paper, 4),
                    "config": cfg.describe()})
    if as_json:
        echo_json(payload)
        return
    console.print(f"{system} ({arrivals}): max sustainable {result.max_rps:.3f} req/s; planner "
                  f"exact {exact:.3f} ({result.max_rps / exact - 1:+.1%}), paper {paper:.3f} "
                  f"({paper / result.max_rps - 1:+.1%} over the simulation); "
                  f"{len(result.probes)} probes of {requests} requests")


def _on_ray(address: str, cfg: Any, scenario: Any, process: Any, requests: int, seed: int,
            guess_rps: float) -> CapacityResult:
    """find_capacity with its probes as Ray tasks, a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from prfaas.serve.deploy.ray import sweep

    sweep.connect(address)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task("capacity probes (max)", total=MAX_PROBES)
            prober = sweep.SpeculativeProber(
                cfg, scenario.lengths, scenario.output_tokens, process, requests, seed,
                lambda: search_rates(guess_rps, REL_TOL, MAX_PROBES),
                on_submit=lambda n: bar.update(task, description=f"capacity probes "
                                               f"({n} submitted to Ray)"))

            def done(p: Probe) -> None:
                bar.update(task, advance=1, description=f"probe {p.rate_rps:.3f} req/s: "
                           f"{'ok' if p.sustainable else 'over'} ({prober.submitted} submitted)")

            result = find_capacity(cfg, scenario.lengths, scenario.output_tokens, process,
                                   requests=requests, seed=seed, guess_rps=guess_rps,
                                   rel_tol=REL_TOL, max_probes=MAX_PROBES,
                                   on_probe=done, probe_at=prober)
            bar.update(task, total=len(result.probes))
    finally:
        sweep.disconnect()
    return result
