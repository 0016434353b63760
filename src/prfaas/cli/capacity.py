"""`prfaas capacity`: the highest sustainable offered rate of a system, by simulation."""

from __future__ import annotations

import click

from prfaas.cli.common import console, echo_json
from prfaas.cli.simulate import config_from, system_options
from prfaas.planner.search import plan_all
from prfaas.sim.capacity import find_capacity
from prfaas.workload.arrivals import make_arrivals


@click.command("capacity")
@system_options
@click.option("--requests", type=int, default=4000, show_default=True,
              help="Requests per probe (same seed at every rate).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(scenario_name: str, system: str, threshold: int | None, n_p: int | None,
            n_d: int | None, link_gbps: float | None, no_pipeline: bool, prefill_order: str,
            arrivals: str, seed: int, requests: int, as_json: bool) -> None:
    """Search the offered rate: sustainable = throughput >= 98% of offered, no growing queue."""
    process = make_arrivals(arrivals)
    scenario, cfg, planned = config_from(scenario_name, system, threshold, n_p, n_d, link_gbps,
                                         no_pipeline, prefill_order)
    exact = planned.systems[system].lambda_max
    paper = plan_all(scenario, mode="paper").systems[system].lambda_max
    result = find_capacity(cfg, scenario.lengths, scenario.output_tokens, process,
                           requests=requests, seed=seed, guess_rps=paper)
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
