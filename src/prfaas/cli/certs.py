"""`prfaas certs init --topology PATH --out DIR`: a CA and a certificate per topology member."""

from __future__ import annotations

import click

from prfaas.security.certs import ROUTER, Member, init_certs
from prfaas.serve.deploy.ray.spec import read_ray_topology


@click.group("certs")
def command() -> None:
    """Certificates for the topology's mutual-TLS links."""


@command.command("init")
@click.option("--topology", "topology_path", default=None, metavar="PATH",
              help="Topology YAML (default: the embedded topologies/local.yaml).")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="Folder for ca.pem and NAME.pem / NAME.key (created; files overwritten).")
@click.option("--days", type=int, default=365, show_default=True, help="Validity.")
def init(topology_path: str | None, out_dir: str, days: int) -> None:
    """A fresh CA and one certificate + key for every worker and for `router`."""
    topo, _ = read_ray_topology(topology_path)  # a Ray topology's `ray:` section is skipped
    members = [Member(w.name, w.host) for w in topo.workers]
    members.append(Member(ROUTER, topo.router_host))
    issued = init_certs(members, out_dir, days)
    click.echo(f"wrote {out_dir}/ca.pem (+ ca.key) and {len(issued)} certificates: "
               + ", ".join(i.name for i in issued))
