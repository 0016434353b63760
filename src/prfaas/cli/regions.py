"""The CLI for scenarios with several PD clusters (`pd_clusters:`): plan, simulate, capacity and
reproduce call into here when the scenario has them; single-cluster scenarios never do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.table import Table

from prfaas.cli.common import console, dumps, echo_json
from prfaas.core.errors import ConfigError
from prfaas.planner.regions_plan import SYSTEMS, plan_regions
from prfaas.scenario import Scenario
from prfaas.sim.regions_report import STEPS, plan_payload, reproduce_regions
from prfaas.sim.regions_run import (
    build_regions,
    find_region_capacity,
    region_workloads,
    simulate_regions,
)
from prfaas.workload.arrivals import make_arrivals

TITLES = {"prfaas_pd": "PrfaaS-PD", "whole_request_routing": "whole-request routing",
          "all_remote": "all remote", "alone": "each alone"}


def parse_rates(items: tuple[str, ...], s: Scenario) -> dict[str, float]:
    """NAME=R pairs of --rate-of."""
    names = [r.name for r in s.pd_clusters]
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ConfigError("--rate-of", item, f"expected NAME=R with NAME one of {names}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError("--rate-of", item, "R must be a number (req/s)") from None
    return out


def plan_command(s: Scenario, mode: str | None, objective: str, as_json: bool) -> None:
    payload = plan_payload(s, mode or s.mode, objective)
    if as_json:
        echo_json(payload)
        return
    console.print(plan_table(payload))


def plan_table(payload: dict[str, Any]) -> Table:
    systems = payload["systems"]
    clusters = list(systems["prfaas_pd"]["pd_clusters"])
    table = Table(title=f"{payload['scenario']}: plan (mode {payload['mode']}, objective "
                  f"{payload['objective']}); per cluster: Λ req/s [t, N_p/N_d, PrfaaS "
                  "instances, egress Gbps]")
    table.add_column("system")
    table.add_column("Λmax (req/s)", justify="right")
    table.add_column("vs whole-request", justify="right")
    for c in clusters:
        table.add_column(c, justify="right")
    base = systems["whole_request_routing"]["lambda_max"]
    for name in SYSTEMS:
        p = systems[name]
        cells = []
        for c in clusters:
            r = p["pd_clusters"][c]
            text = f"{r['lambda_max']:.2f}"
            if name == "prfaas_pd":
                text += (f" [t {r['threshold_tokens'] / 1000:.1f}K, {r['n_p']}/{r['n_d']}, "
                         f"{r['prfaas_instances']:.2f}, {r['egress_gbps']:.1f}]")
            elif name == "alone":
                text += f" [{r['n_p']}/{r['n_d']}]"
            cells.append(text)
        table.add_row(TITLES[name], f"{p['lambda_max']:.3f}", f"{p['lambda_max'] / base:.2f}x",
                      *cells)
    return table


def simulate_command(s: Scenario, rate_of: tuple[str, ...], share: str, objective: str,
                     requests: int | None, duration: float | None, arrivals: str, seed: int,
                     as_json: bool) -> None:
    plan = plan_regions(s, "exact", objective)["prfaas_pd"]
    rates = {r.name: r.rate_rps if r.rate_rps is not None
             else round(0.9 * plan.pd_clusters[r.name].lambda_max, 3) for r in s.pd_clusters}
    rates.update(parse_rates(rate_of, s))
    started = time.perf_counter()
    summary = simulate_regions(build_regions(s, plan, share), region_workloads(
        s, rates, make_arrivals(arrivals), requests=requests if duration is None else None,
        duration_s=duration, seed=seed))
    summary.update({"scenario": s.name, "objective": objective, "arrivals": arrivals,
                    "seed": seed, "rates_rps": rates})
    if as_json:
        echo_json(summary)
        return
    table = Table(title=f"{s.name}: {share} share, {arrivals} arrivals")
    for col in ("cluster", "offered", "throughput", "TTFT P50 / P90 s", "offload", "egress Gbps"):
        table.add_column(col, justify="right")
    for name, c in summary["pd_clusters"].items():
        table.add_row(name, f"{c['offered_rps']:.3f}", f"{c['throughput_rps']:.3f}",
                      f"{c['ttft_p50_s']:.2f} / {c['ttft_p90_s']:.2f}",
                      f"{c['offload_fraction']:.3f}", f"{c['egress_gbps']:.2f}")
    console.print(table)
    console.print(f"PrfaaS utilization {summary['prfaas']['utilization']}; "
                  f"{summary['events']:,} events in {time.perf_counter() - started:.2f} s")


def capacity_command(s: Scenario, share: str, objective: str, requests: int, seed: int,
                     arrivals: str, as_json: bool) -> None:
    plan = plan_regions(s, "exact", objective)["prfaas_pd"]
    result = find_region_capacity(s, plan, build_regions(s, plan, share), requests=requests,
                                  seed=seed, arrivals=arrivals)
    result.update({"scenario": s.name, "share_policy": share, "objective": objective,
                   "planner_exact_rps": round(plan.lambda_max, 4)})
    if as_json:
        echo_json(result)
        return
    console.print(f"PrfaaS-PD ({share}, {arrivals}): max sustainable {result['max_rps']:.3f} "
                  f"req/s along the plan's mix {result['max_rps_of']}; planner exact "
                  f"{plan.lambda_max:.3f} ({result['max_rps'] / plan.lambda_max - 1:+.1%}); "
                  f"{len(result['probes'])} probes of {requests} requests")


def reproduce_command(s: Scenario, folder: Path) -> None:
    from rich.progress import Progress

    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("reproducing", total=STEPS)
        result = reproduce_regions(s, folder, lambda label: progress.update(
            task, advance=1, description=label))
    console.print(plan_table(result["plans"]["throughput_exact"]))
    console.print(plan_table(result["plans"]["fair_exact"]))
    cap = result["capacity"]
    console.print(f"simulated capacity (DRR): {cap['drr']['max_rps']:.3f} req/s at 4,000 "
                  f"requests per probe, {cap['drr_16000']['max_rps']:.3f} at 16,000; exact "
                  f"plan {result['planned_exact_rps']:.3f}")
    for policy, runs in result["fairness"]["policies"].items():
        for hog, run in runs["overloaded"].items():
            for victim, rel in run["victims"].items():
                console.print(f"{policy}: {hog} at 3x its plan -> {victim} keeps "
                              f"{rel['throughput_ratio']:.1%} of its throughput, P90 TTFT "
                              f"x{rel['ttft_p90_ratio']:.2f} of the fair run "
                              f"({'holds' if rel['holds'] else 'fails'})")
    result["wall_s"] = round(time.perf_counter() - started, 2)
    (folder / "results.json").write_text(dumps(result) + "\n")
    console.print(f"wrote {', '.join(result['plots'])} and results.json to {folder}")


def reproduce_live_command(scenario: str, folder: Path, quick: bool,
                           scales_text: str | None) -> None:
    """`reproduce --live` on a multi-cluster scenario (experiments/regions_live.py)."""
    from prfaas.emulated.cli import parse_scales
    from prfaas.experiments.regions_live import QUICK_TWIN, reproduce_regions_live

    if quick and scenario in QUICK_TWIN:
        console.print(f"--quick deploys {QUICK_TWIN[scenario]}: {scenario} at half size, the "
                      "live scale of one host")
    result = reproduce_regions_live(scenario, folder, quick,
                                    parse_scales(scales_text) if scales_text else None,
                                    tick=lambda label: console.print(label))
    table = Table(title=f"{result['deployed']} live (emulated) vs simulator, same requests, "
                        f"{result['load']:.0%} of each region's plan")
    for col in ("region", "offered", "throughput live / sim", "TTFT P50 live / sim",
                "TTFT P90 live / sim", "offload live / sim"):
        table.add_column(col)
    for name, r in result["regions"].items():
        lv, sm = r["live"], r["sim"]
        table.add_row(name, f"{lv['offered_rps']:.3f}",
                      f"{lv['throughput_rps']:.3f} / {sm['throughput_rps']:.3f}",
                      f"{_s(lv['ttft_p50_s'])} / {_s(sm['ttft_p50_s'])}",
                      f"{_s(lv['ttft_p90_s'])} / {_s(sm['ttft_p90_s'])}",
                      f"{lv['offload_fraction']:.3f} / {sm['offload_fraction']:.3f}")
    console.print(table)
    console.print(f"wrote live.json and {Path(result['plot']).name} to {folder}")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
