"""`prfaas sim-vs-live`: a topology's deployment against the simulator built from its measured
profile, at two or more Poisson loads (experiments/sim_vs_live.py). Writes DIR/sim_vs_live.json,
DIR/sim_vs_live.png, DIR/profile.yaml (measured here unless --profile is given) and
DIR/scenario.yaml (the deployment as a scenario: `prfaas plan --scenario DIR/scenario.yaml`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import yaml

from prfaas.core.errors import ConfigError


@click.command("sim-vs-live")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="Topology file (default: the embedded local one).")
@click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False),
              help="A measured profile to simulate with (default: measure it here first).")
@click.option("--quick", is_flag=True, help="24 requests at 2 loads (else 60 at 3).")
@click.option("--requests", default=None, type=int, help="Requests per load.")
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

    from prfaas.experiments import sim_vs_live as svl
    from prfaas.experiments.engine_facts import measure_profile, model_facts
    from prfaas.experiments.sim_vs_live_plot import ttft_scatter
    from prfaas.serve.topology import load_topology

    topology = load_topology(topology_path)
    options = svl.QUICK if quick else svl.FULL
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
    profile = profile.resolve()
    facts = model_facts(topology)
    scenario = svl.scenario_dict(topology, profile, options, facts.max_context_tokens)
    (out / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    result = svl.run(topology, profile, options, out, tick)
    (out / "sim_vs_live.json").write_text(json.dumps(result, indent=1) + "\n")
    ttft_scatter(result, out / "sim_vs_live.png")
    for load in result["loads"]:
        click.echo(f"{load['offered_rps']:.3f} req/s, {load['requests']} requests: TTFT MAPE "
                   f"{load['ttft_mape']}, throughput live {load['throughput_live_rps']} sim "
                   f"{load['throughput_sim_rps']}, routes agree {load['route_agreement']}, "
                   f"live errors {load['errors_live']}")
    click.echo(f"meets goal: {result['meets_goal']}; wrote {out / 'sim_vs_live.json'}")
