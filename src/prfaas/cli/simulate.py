"""`prfaas simulate`: one discrete-event run of a system under a workload.

Defaults come from the planner's optimum (mode `exact`): t, N_p, N_d; the flags override them.
Without --rate a synthetic run offers 90% of the planner's capacity for that system. JSON on
stdout with --json; with --out DIR, `result.json` (deterministic: no wall-clock figures),
`timing.json` and `requests.csv`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from prfaas.cli.common import console, dumps, echo_json
from prfaas.core.errors import ConfigError
from prfaas.policy.rebalancer import RebalancerConfig
from prfaas.scenario import load_scenario
from prfaas.sim.link import LinkSchedule
from prfaas.sim.metrics import REQUEST_COLUMNS, request_table
from prfaas.sim.outages import parse_outage
from prfaas.sim.run import build_workload, simulate
from prfaas.sim.system import build_system

WALL_KEYS = ("sim_wall_s",)


def system_options(f: Any) -> Any:
    """Flags shared by simulate and capacity."""
    for opt in reversed([
        click.option("--scenario", "scenario_name", default="paper-case-study",
                     show_default=True, help="Built-in scenario name or a YAML path."),
        click.option("--system", default="prfaas_pd", show_default=True,
                     help="prfaas_pd, homogeneous_pd or naive_heterogeneous."),
        click.option("--threshold", type=int, default=None, help="Override t (tokens)."),
        click.option("--n-p", type=int, default=None, help="Override N_p."),
        click.option("--n-d", type=int, default=None, help="Override N_d."),
        click.option("--link-gbps", type=float, default=None,
                     help="Constant inter-cluster capacity (overrides the scenario's)."),
        click.option("--no-pipeline", is_flag=True, help="Send KV only after the prefill."),
        click.option("--prefill-order", default="fifo", show_default=True,
                     help="Prefill queue order: fifo or sjf (shortest first)."),
        click.option("--arrivals", default="uniform", show_default=True,
                     help="uniform, poisson or bursty."),
        click.option("--seed", type=int, default=0, show_default=True),
    ]):
        f = opt(f)
    return f


def config_from(scenario_name: str, system: str, threshold: int | None, n_p: int | None,
                n_d: int | None, link_gbps: float | None, no_pipeline: bool,
                prefill_order: str, max_queued_per_prefill: int | None = None) -> Any:
    """(scenario, SystemConfig, the scenario's exact plan) for the shared flags (and
    simulate's queue limit)."""
    from prfaas.planner.search import plan_all

    scenario = load_scenario(scenario_name)
    # only the system simulated (and prfaas_pd, whose t threshold policies borrow): an unknown
    # name searches nothing and build_system names the known ones
    planned = plan_all(scenario, mode="exact", only={"prfaas_pd", system})
    overrides: dict[str, Any] = {"prefill_order": prefill_order}
    if link_gbps is not None:
        overrides["link"] = LinkSchedule.constant(link_gbps)
    if no_pipeline:
        overrides["pipelined"] = False
    if max_queued_per_prefill is not None:
        overrides["max_queued_per_prefill"] = max_queued_per_prefill
    cfg = build_system(scenario, system, threshold_tokens=threshold, n_p=n_p, n_d=n_d,
                       planned=planned, **overrides)
    return scenario, cfg, planned


@click.command("simulate")
@system_options
@click.option("--rate", type=float, default=None, help="Offered requests/s (rescales a trace).")
@click.option("--duration", type=float, default=None, help="Simulated seconds of arrivals.")
@click.option("--requests", type=int, default=None, help="Number of requests.")
@click.option("--trace", type=str, default=None, help="Mooncake .jsonl or Azure .csv trace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write result.json, timing.json and requests.csv here.")
@click.option("--policy", default=None, help="Routing policy (default: the system's own).")
@click.option("--cache-scope", type=click.Choice(["global", "cluster", "instance"]),
              default=None, help="Prefix caches (trace hash_ids): one pool, per cluster, per "
              "instance.")
@click.option("--cache-capacity", default=None, help="Bytes per pool (80G...) or unlimited.")
@click.option("--snapshot-policy", default="every_block", show_default=True,
              help="State snapshots: every_block, every_k or request_end.")
@click.option("--link-schedule", type=str, default=None,
              help="YAML/JSON list of [start_s, gbps]: the link's capacity over time.")
@click.option("--ttft-slo", type=float, default=None,
              help="Reject requests whose predicted TTFT exceeds this (seconds).")
@click.option("--outage", "outage_specs", multiple=True, metavar="NAME@START+DURATION",
              help="Take instances (prfaas, pd-p, pd-d, pd or an instance id) or the link "
              "down for DURATION s from START s of simulated time (repeatable); JSON gets "
              "TTFT and throughput before/during/after.")
@click.option("--max-queued-per-prefill", type=int, default=None,
              help="Requests waiting for their first token at one prefill instance before the "
              "next spills to the other route (rejected when both are full), as the live "
              "router's admission.max_queued_per_prefill; JSON gets spilled and queue_full.")
@click.option("--rate-of", "rate_of", multiple=True, metavar="NAME=R",
              help="With several PD clusters: cluster NAME's offered rate (repeatable; "
              "default: its scenario rate_rps, else 90% of its planned capacity).")
@click.option("--share", type=click.Choice(["drr", "fcfs"]), default="drr", show_default=True,
              help="With several PD clusters: the PrfaaS cluster's per-tenant share.")
@click.option("--objective", type=click.Choice(["throughput", "fair"]), default="throughput",
              show_default=True, help="With several PD clusters: the plan simulated.")
@click.option("--rebalance", is_flag=True,
              help="Move PD instances between prefill and decode roles (Eq. 8) when the "
              "imbalance persists; JSON gets role_changes and final_split.")
@click.option("--shape", is_flag=True,
              help="Run the shape controller (policy/shape.py): the planner re-solved on the "
              "router's window moves PD instances between roles, priced and with hysteresis; "
              "JSON gets role_changes (with reasons), final_split and shape (refusals).")
def command(scenario_name: str, system: str, threshold: int | None, n_p: int | None,
            n_d: int | None, link_gbps: float | None, no_pipeline: bool, prefill_order: str,
            arrivals: str, seed: int, rate: float | None, duration: float | None,
            requests: int | None, trace: str | None, as_json: bool, out_dir: str | None,
            policy: str | None = None, cache_scope: str | None = None,
            cache_capacity: str | None = None, snapshot_policy: str = "every_block",
            link_schedule: str | None = None, ttft_slo: float | None = None,
            outage_specs: tuple[str, ...] = (), max_queued_per_prefill: int | None = None,
            rebalance: bool = False, rate_of: tuple[str, ...] = (), share: str = "drr",
            objective: str = "throughput", shape: bool = False) -> None:
    """Simulate SYSTEM under a synthetic or trace workload; report TTFT, TPOT, egress."""
    if _regions(scenario_name, system, trace, rate, rate_of):
        from prfaas.cli.regions import simulate_command

        single = {"--threshold": threshold, "--n-p": n_p, "--n-d": n_d,
                  "--link-gbps": link_gbps, "--policy": policy, "--cache-scope": cache_scope,
                  "--cache-capacity": cache_capacity, "--link-schedule": link_schedule,
                  "--ttft-slo": ttft_slo, "--max-queued-per-prefill": max_queued_per_prefill,
                  "--outage": outage_specs or None, "--rebalance": rebalance or None,
                  "--shape": shape or None,
                  "--no-pipeline": no_pipeline or None, "--out": out_dir}
        given = sorted(flag for flag, value in single.items() if value is not None)
        if given:
            raise ConfigError(given[0], single[given[0]],
                              "not supported with several PD clusters (the scenario's "
                              "pd_clusters set each cluster's own split, link and threshold)")

        simulate_command(load_scenario(scenario_name), rate_of, share, objective, requests,
                         duration, arrivals, seed, as_json)
        return
    outages = [parse_outage(text) for text in outage_specs]
    scenario, cfg, planned = config_from(scenario_name, system, threshold, n_p, n_d, link_gbps,
                                         no_pipeline, prefill_order, max_queued_per_prefill)
    if rate is None and trace is None:
        rate = round(0.9 * planned.systems[system].lambda_max, 3)
    workload = build_workload(scenario.lengths, scenario.output_tokens, rate_rps=rate,
                              duration_s=duration, requests=requests,
                              arrivals=arrivals, trace=trace, seed=seed)
    sim: Any
    roles = RebalancerConfig() if rebalance else None
    plugins = [shape_plugin(scenario, cfg)] if shape else []
    if shape and rebalance:
        raise ConfigError("--shape", True, "not with --rebalance: both move PD instances")
    if policy or cache_scope or cache_capacity or link_schedule or ttft_slo is not None:
        from prfaas.sim.policy_run import run_from_flags

        sim, summary = run_from_flags(
            scenario, system, workload, policy=policy, cache_scope=cache_scope,
            cache_capacity=cache_capacity, link_schedule=link_schedule,
            snapshot_policy=snapshot_policy, ttft_slo_s=ttft_slo, threshold=threshold,
            n_p=n_p, n_d=n_d, link_gbps=link_gbps, no_pipeline=no_pipeline,
            prefill_order=prefill_order, rebalance=roles, planned=planned, outages=outages,
            max_queued_per_prefill=max_queued_per_prefill, plugins=plugins)
    else:
        sim, summary = simulate(cfg, workload, rebalance=roles, outages=outages,
                                plugins=plugins)
    summary["arrivals"] = arrivals if trace is None else "trace"
    summary["seed"] = seed
    if out_dir:
        write_outputs(Path(out_dir), summary, request_table(sim))
    if as_json:
        echo_json(summary)
        return
    _print(summary)


def shape_plugin(scenario: Any, cfg: Any) -> Any:
    """The shape controller with its defaults on the scenario's planner inputs (profiles,
    link, the system's PrfaaS instances), as its ShapePlugin."""
    from dataclasses import replace

    from prfaas.planner.search import inputs_from_scenario
    from prfaas.policy.shape import ShapeController
    from prfaas.sim.shape import ShapePlugin

    inputs = replace(inputs_from_scenario(scenario), n_prfaas=cfg.n_prfaas)
    return ShapePlugin(ShapeController(inputs))


def _regions(scenario_name: str, system: str, trace: str | None, rate: float | None,
             rate_of: tuple[str, ...]) -> bool:
    """Whether this run is of several PD clusters (and the flags fit one)."""
    if not load_scenario(scenario_name).pd_clusters:
        if rate_of:
            raise ConfigError("--rate-of", list(rate_of), "needs a scenario with pd_clusters")
        return False
    if system != "prfaas_pd" or trace or rate is not None:
        raise ConfigError("--system/--trace/--rate", (system, trace, rate),
                          "a scenario with pd_clusters simulates prfaas_pd with --rate-of")
    return True


def write_outputs(folder: Path, summary: dict[str, Any], rows: Iterable[tuple[Any, ...]]
                  ) -> None:
    """`rows`: one tuple per request in `REQUEST_COLUMNS` order (`request_table`)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = {k: v for k, v in summary.items() if k not in WALL_KEYS}
    (folder / "result.json").write_text(dumps(result) + "\n")
    (folder / "timing.json").write_text(dumps({k: summary[k] for k in WALL_KEYS}) + "\n")
    rows = iter(rows)
    first = next(rows, None)
    with (folder / "requests.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS if first is not None else ["id"])
        if first is not None:
            writer.writerow(first)
            writer.writerows(rows)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _print(s: dict[str, Any]) -> None:
    from rich.table import Table

    t, tp, eg = s["ttft_s"], s["tpot_s"], s["egress_gbps"]
    table = Table(title=f"{s['system']}: {s['workload']}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("offered / throughput", f"{s['offered_rps']:.3f} / {s['throughput_rps']:.3f} "
                  f"req/s ({s['completed']:,} of {s['requests']:,} completed)")
    table.add_row("TTFT mean / P50 / P90 / P99",
                  f"{t['mean']:.2f} / {t['p50']:.2f} / {t['p90']:.2f} / {t['p99']:.2f} s")
    table.add_row("TPOT mean / P90", f"{tp['mean'] * 1000:.1f} / {tp['p90'] * 1000:.1f} ms")
    table.add_row("offload fraction", f"{s['offload_fraction']:.3f}")
    table.add_row("egress mean / P99 (1 s windows)", f"{eg['mean']:.1f} / {eg['p99']:.1f} Gbps")
    for key in ("prefix_hit_fraction", "ideal_prefix_hit_fraction", "rejected"):
        if key in s:
            table.add_row(key.replace("_", " "), f"{s[key]}")
    th = s.get("threshold_tokens")
    if isinstance(th, dict) and th.get("mean") is not None:
        table.add_row("threshold t mean (min..max)",
                      f"{th['mean']:,.0f} ({th['min']:,}..{th['max']:,}) tokens")
    table.add_row("utilization", ", ".join(f"{k} {v:.2f}" for k, v in s["utilization"].items()))
    table.add_row("in system mean / max", f"{s['queue']['in_system_mean']:.1f} / "
                  f"{s['queue']['in_system_max']}")
    for o in s.get("outages", []):
        w = o["windows"]
        table.add_row(f"outage {o['outage']}: TTFT mean", " / ".join(
            f"{k} {_num(w[k]['ttft_s']['mean'], '.2f')} s" for k in ("before", "during", "after")))
        table.add_row("  throughput", " / ".join(
            f"{k} {_num(w[k]['throughput_rps'], '.3f')}" for k in ("before", "during", "after"))
            + f" req/s; re-run {s['rerun_requests']}, lost {s['lost']} in the run")
    table.add_row("simulator", f"{s['events']:,} events in {s['sim_wall_s']:.2f} s wall")
    console.print(table)
