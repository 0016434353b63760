"""`prfaas serve`: start a topology's router and workers here; Ctrl-C or SIGTERM stops all."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from prfaas.core.errors import ConfigError
from prfaas.security.apikey import check_key
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.proc import REQUEST_LOG_ENV
from prfaas.serve.router.service import build_policy
from prfaas.serve.topology import Topology, load_topology

if TYPE_CHECKING:
    from prfaas.serve.deploy.ray.deployment import RayDeployment as RayDeploymentT
    from prfaas.serve.deploy.ray.spec import RaySpec as RaySpecT


def _deployment(topo: Topology, log_dir: str | None, key: str | None,
                ray_address: str | dict[str, str] | None, ray_spec: RaySpecT | None,
                request_log: str | None = None) -> Deployment | RayDeploymentT:
    def log(m: str) -> None:
        click.echo(f"launcher: {m}", err=True)

    if ray_address is None:
        env = {REQUEST_LOG_ENV: str(Path(request_log).absolute())} if request_log else None
        return Deployment(topo, log_dir, log=log, api_key=key, router_env=env)
    if request_log is not None:
        raise ConfigError("--request-log", request_log, "is not supported with --ray (the "
                          "router runs on a Ray node)")
    from prfaas.serve.deploy.ray.deployment import RayDeployment
    from prfaas.serve.deploy.ray.spec import RaySpec

    return RayDeployment(topo, ray_spec or RaySpec(), ray_address, log_dir=log_dir, log=log,
                         api_key=key)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


@click.command("serve")
@click.option("--topology", "topology_path", default=None, metavar="PATH",
              help="Topology YAML (default: the embedded topologies/local.yaml).")
@click.option("--port", type=int, default=None, help="Router port (overrides the topology; 0 = "
              "any free port).")
@click.option("--policy", default=None, help="Routing policy name (policy/ registry).")
@click.option("--threshold", "threshold_tokens", type=int, default=None,
              help="Length threshold t in tokens (overrides the topology).")
@click.option("--api-key", default=None, envvar="PRFAAS_API_KEY", show_envvar=True,
              help="Clients must send `Authorization: Bearer KEY` (/health stays open).")
@click.option("--protect-metrics", is_flag=True,
              help="/metrics needs the API key too (default: open, or the topology's "
              "security.metrics).")
@click.option("--log-dir", default=None,
              help="Where component logs go (default: a temp dir, removed on stop).")
@click.option("--scenario", "scenario_name", default=None, metavar="NAME|PATH",
              help="Run a scenario's system as emulated workers (instead of --topology).")
@click.option("--system", default="prfaas_pd", show_default=True,
              help="With --scenario: prfaas_pd | homogeneous_pd | naive_heterogeneous.")
@click.option("--scales", "scales_text", default=None, metavar="time=A,bytes=B,tokens=D,output=G",
              help="With --scenario: the emulation's unit scales (docs/emulated.md).")
@click.option("--ray", "ray_values", multiple=True, metavar="ADDRESS|RESOURCE=ADDRESS",
              help="Run the router and workers on the Ray cluster at ADDRESS (its GCS host:port, "
              "or ray://HEAD:PORT), placed by the topology's `ray:` resources; or one cluster per "
              "datacenter, repeated: --ray dc_prfaas=ADDR --ray dc_local=ADDR (docs/deploy.md).")
@click.option("--request-log", default=None, metavar="PATH",
              help="The router appends one JSON line per request here (its id, the client's "
              "X-Request-Id, status, route, token counts, TTFT, end-to-end time; "
              "docs/clients.md).")
def command(topology_path: str | None, port: int | None, policy: str | None,
            api_key: str | None, protect_metrics: bool,
            threshold_tokens: int | None, log_dir: str | None, scenario_name: str | None,
            system: str, scales_text: str | None, ray_values: tuple[str, ...],
            request_log: str | None) -> None:
    """Start the router and every worker of the topology as processes on this host."""
    ray_spec = None
    ray_address: str | dict[str, str] | None = None
    if ray_values:
        from prfaas.serve.deploy.ray.spec import parse_ray_addresses

        ray_address = parse_ray_addresses(ray_values)
    if scenario_name is not None:
        from prfaas.emulated.cli import scenario_topology

        topo = scenario_topology(scenario_name, system, scales_text, topology_path)
    elif ray_address is not None:  # the file may carry a `ray:` section (placement)
        from prfaas.serve.deploy.ray.spec import load_ray_topology

        topo, ray_spec = load_ray_topology(topology_path)
    else:
        topo = load_topology(topology_path)
    if port is not None:
        topo = replace(topo, router_port=port)
    if policy is not None:
        topo = replace(topo, policy=policy)
    if threshold_tokens is not None:
        topo = replace(topo, policy_args={**topo.policy_args,
                                          "threshold_tokens": threshold_tokens})
    if not 0 <= topo.router_port < 65536:
        raise ConfigError("--port", topo.router_port, "must be in [0, 65535]")
    build_policy(topo)  # a bad --policy/--threshold fails here, before any process starts
    if protect_metrics:
        topo = replace(topo, security=replace(topo.security, metrics="protected"))
    key = check_key(api_key, "--api-key") if api_key is not None else None
    deployment = _deployment(topo, log_dir, key, ray_address, ray_spec, request_log)
    # SIGINT too, explicitly: a process started in the background of a non-interactive shell
    # (CI scripts, `cmd &`) inherits SIGINT ignored, and Python then leaves it ignored, so
    # `kill -INT` would not stop the deployment
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        click.echo(f"starting {len(topo.workers)} workers + router of '{topo.name}' "
                   f"(logs in {deployment.log_dir})")
        deployment.start()
        nodes = {} if isinstance(deployment, Deployment) else deployment.info()
        for w in deployment.topology.workers:
            where = f"  node {nodes[w.name]['node_id'][:12]}" if w.name in nodes else ""
            click.echo(f"  {w.name:<12} {w.role:<7} {w.url}{where}")
        click.echo(f"router: {deployment.url}  (policy {topo.policy} {topo.policy_args}); "
                   "Ctrl-C stops everything")
        while True:  # the supervisor restarts what exits; only a signal ends the deployment
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        click.echo("stopping")
    finally:
        deployment.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
