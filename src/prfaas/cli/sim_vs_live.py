"""`prfaas sim-vs-live`: a topology's deployment against the simulator built from its measured
profile and against a no-simulator baseline, at two or more Poisson loads
(experiments/sim_vs_live/). Writes DIR/sim_vs_live.json, DIR/sim_vs_live.png, DIR/profile.yaml
(measured here unless --profile is given) and DIR/scenario.yaml (the deployment as the
simulator saw it: `prfaas plan --scenario DIR/scenario.yaml`). A load that cannot complete its
requests in its time ends the command with one line saying which and why (exit 2); what was
measured up to then is written first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import yaml

from prfaas.core.errors import ConfigError


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def summary(load: dict[str, Any]) -> str:
    """One line per load: what the verdict rests on."""
    ci = load["ttft_mape_ci90"]
    return (f"{load['share_of_capacity']:.2f} of capacity ({load['offered_rps']:.3f} req/s), "
            f"{load['compared']}/{load['requests']} requests: TTFT MAPE "
            f"{_pct(load['ttft_mape'])} [{_pct(ci[0]) if ci else '-'}, "
            f"{_pct(ci[1]) if ci else '-'}], baseline {_pct(load['baseline_ttft_mape'])}, "
            f"without overheads {_pct(load['ttft_mape_without_route_overheads'])}; "
            f"P50 {_signed(load['ttft_p50_err'])}, P90 {_signed(load['ttft_p90_err'])}, "
            f"E2E {_signed(load['e2e_mean_err'])}; throughput live/sim "
            f"{load['throughput_live_rps']:.3f}/{load['throughput_sim_rps']:.3f}, routes "
            f"{load['route_agreement']:.0%}")


@click.command("sim-vs-live")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="Topology file (default: the embedded local one).")
@click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False),
              help="A measured profile to simulate with (default: measure it here first).")
@click.option("--quick", is_flag=True,
              help="48 requests at 0.25 and 0.75 of capacity (else 96 at 0.25/0.5/0.75).")
@click.option("--requests", default=None, type=int,
              help="Requests per load (a verdict needs at least 48).")
@click.option("--loads", default=None,
              help="Comma-separated loads as fractions of the planner's capacity.")
@click.option("--warmup", default=None, type=int,
              help="Unmeasured requests through the fresh deployment before the first load "
                   "(default 8; 0: none).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False))
def command(topology_path: str | None, profile_path: str | None, quick: bool,
            requests: int | None, loads: str | None, warmup: int | None, out_dir: str) -> None:
    """Replay a Poisson workload through the deployment and the simulator; compare."""
    from dataclasses import replace

    from prfaas.experiments.engine_facts import measure_profile, model_facts
    from prfaas.experiments.sim_vs_live.live import LoadIncomplete
    from prfaas.experiments.sim_vs_live.options import FULL, QUICK
    from prfaas.experiments.sim_vs_live.plot import ttft_scatter
    from prfaas.experiments.sim_vs_live.run import run
    from prfaas.serve.topology import load_topology

    topology = load_topology(topology_path)
    options = QUICK if quick else FULL
    if requests is not None:
        options = replace(options, requests=requests)
    if warmup is not None:
        options = replace(options, warmup_requests=warmup)
    if loads is not None:
        try:
            fractions = tuple(float(x) for x in loads.split(","))
        except ValueError:
            raise ConfigError("loads", loads, "expected comma-separated numbers") from None
        options = replace(options, load_fractions=fractions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def tick(msg: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)

    if profile_path is None:
        model_facts(topology)  # fail fast on an engine without a profiler or spec
        tick("measuring the engine's profile")
        # (the idle points are measured on the loads' deployment, unless the options say not)
        doc = measure_profile(topology, str(out / "logs"),
                              idle_routes=not options.idle_points_on_deployment)
        profile = out / "profile.yaml"
        profile.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
        tick(f"wrote {profile}")
    else:
        profile = Path(profile_path)
    result = run(topology, profile.resolve(), options, out, tick)
    (out / "sim_vs_live.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "scenario.yaml").write_text(yaml.safe_dump(result["scenario"], sort_keys=False))
    ttft_scatter(result, out / "sim_vs_live.png")
    for load in result["loads"]:
        click.echo(summary(load))
    if "incomplete" in result:
        raise LoadIncomplete(f"sim-vs-live stopped: {result['incomplete']} "
                             f"(measured so far: {out / 'sim_vs_live.json'})")
    for v in result["verdict"]["loads"]:
        click.echo(f"{v['share_of_capacity']:.2f} of capacity: "
                   f"{'predicts' if v['predicts'] else 'does not predict'}: {v['why']}")
    click.echo(f"verdict: {result['verdict']['line']}; "
               f"{'predicts' if result['verdict']['predicts'] else 'does not predict'} this "
               f"deployment; wrote {out / 'sim_vs_live.json'}")
