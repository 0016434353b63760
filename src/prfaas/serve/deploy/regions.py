"""One PrfaaS cluster shared by several PD clusters on this host, each PD cluster with its own
router and its own kernel-shaped link (issue 22).

The PrfaaS workers and the tenant gateway (serve/gateway.py) run in one network namespace
joined to this host by one veth pair per PD cluster (region) k, each shaped with its own
`tc tbf` at that region's rate (serve/deploy/netns.py). Region k's decode workers bind the host
end of its veth (10.231.<i_k>.1), so the KV for region k leaves the namespace through veth k
only: one region's link is one veth, and `partition(k)` takes it down (nothing crosses it; the
others carry on). Region k's router reaches the gateway through veth k too (its control calls
are host -> namespace, unshaped), so a partition cuts that region off the PrfaaS cluster as a
real one would, and its router's health checks take the PrfaaS path down. The gateway meters
each region's bytes at the namespace end of its veth (`link_interface`, serve/link_meter.py).

Each region is an ordinary `Deployment` (serve/deploy/launcher.py) of its router, PD-P and PD-D
workers; its topology's one `prfaas` worker is the gateway (started here; the Deployment waits
for it), and its router holds the region's tenant key (PRFAAS_TENANT_KEY). The PrfaaS workers
listen on the namespace's loopback: only the gateway reaches them. The regions start in
parallel, each waiting for the gateway before its router; `stop` stops every side at once.
Not restarted when they exit (the regions' own processes are, by their Deployment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from prfaas.core.errors import PrfaasError
from prfaas.serve.deploy.launcher import Deployment, DeploymentError, reap, terminate
from prfaas.serve.deploy.netns import NetnsLink, _run, _tbf, free_index
from prfaas.serve.gateway import GatewayConfig
from prfaas.serve.ports import free_port
from prfaas.serve.router.backends.native import TENANT_KEY_ENV
from prfaas.serve.topology import LinkSpec, Topology, WorkerSpec

GATEWAY = "prfaas-gw"  # the gateway's worker name in every region's topology


@dataclass(frozen=True)
class RegionSpec:
    name: str
    topology: Topology  # router, PD-P, PD-D, and one `prfaas` worker named GATEWAY
    rate_gbps: float  # its link's shaped rate (live Gbps)
    key: str  # its tenant key


def add_veth(ns: str, index: int, rate_gbps: float) -> NetnsLink:
    """Another shaped veth pair into the namespace `ns` (NetnsLink._build without the
    namespace): host end pfh<index> 10.231.<index>.1, namespace end pfn<index> .2."""
    link = NetnsLink(ns, index, rate_gbps)
    host_if, ns_if = f"pfh{index}", f"pfn{index}"
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    _run("ip", "link", "set", ns_if, "netns", ns)
    _run("ip", "addr", "add", f"{link.host_ip}/30", "dev", host_if)
    _run("ip", "link", "set", host_if, "up")
    inside = ("ip", "netns", "exec", ns)
    _run(*inside, "ip", "addr", "add", f"{link.ns_ip}/30", "dev", ns_if)
    _run(*inside, "ip", "link", "set", ns_if, "up")
    _run(*inside, "tc", "qdisc", "add", "dev", ns_if, "root", *_tbf(rate_gbps))
    return link


class RegionsDeployment:
    def __init__(self, prfaas_workers: tuple[WorkerSpec, ...], prfaas_topology: Topology,
                 gateway: GatewayConfig, regions: list[RegionSpec],
                 log_dir: str | Path | None = None, start_timeout_s: float = 300.0) -> None:
        """`prfaas_topology`: model, link connections and timeouts of the PrfaaS workers (its
        workers are replaced); `gateway`: tenants, profile and policy (workers, port filled
        here)."""
        if [t.name for t in gateway.tenants] != [r.name for r in regions]:
            raise PrfaasError("gateway tenants and regions must be the same names, in order")
        self.prfaas_workers, self.prfaas_base = prfaas_workers, prfaas_topology
        self.gateway_base, self.regions = gateway, regions
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="prfaas-regions-"))
        self.start_timeout_s = start_timeout_s
        self.links: dict[str, NetnsLink] = {}
        self.deployments: dict[str, Deployment] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.gateway_port = 0

    def __enter__(self) -> RegionsDeployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, region: str) -> str:
        return self.deployments[region].url

    def gateway_url(self, region: str) -> str:
        """The gateway as region `region` reaches it (through its own link)."""
        return f"http://{self.links[region].ns_ip}:{self.gateway_port}"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._links()
            self.gateway_port = free_port()
            for r in self.regions:
                self.deployments[r.name] = self._region(r)
            self._prfaas_side()
            # the regions start meanwhile; each waits for the gateway's /health (a worker on
            # an address it does not own) before starting its router
            with ThreadPoolExecutor(len(self.regions)) as pool:
                started = [pool.submit(dep.start) for dep in self.deployments.values()]
                try:
                    self._wait_gateway()
                finally:
                    for f in started:
                        f.result()
        except BaseException:
            self.stop()
            raise

    def _links(self) -> None:
        first = self.regions[0]
        ns = NetnsLink.create(first.rate_gbps)
        self.links[first.name] = ns
        used = {ns.index}
        for r in self.regions[1:]:
            index = free_index(ns.index, used)  # the next free one in NetnsLink's range
            used.add(index)
            self.links[r.name] = add_veth(ns.name, index, r.rate_gbps)

    def _region(self, r: RegionSpec) -> Deployment:
        link = self.links[r.name]

        def place(w: WorkerSpec) -> WorkerSpec:
            if w.name == GATEWAY:
                return replace(w, host=link.ns_ip, port=self.gateway_port)
            return replace(w, host=link.host_ip) if w.role == "pd-d" else w

        topo = replace(r.topology, workers=tuple(place(w) for w in r.topology.workers))
        topo.worker(GATEWAY)  # (a region without its gateway worker fails here)
        # the gateway is at the namespace's address, which the Deployment does not own: it
        # waits for its /health and does not start it
        return Deployment(topo, self.log_dir / r.name, self.start_timeout_s,
                          router_env={TENANT_KEY_ENV: r.key},
                          local_hosts=frozenset({link.host_ip}))

    def _prfaas_side(self) -> None:
        ns = self.links[self.regions[0].name]
        workers = tuple(replace(w, host="127.0.0.1", port=free_port()) for w in
                        self.prfaas_workers)
        decoders = tuple(w for dep in self.deployments.values()
                         for w in dep.topology.by_role("pd-d"))
        rate = max(r.rate_gbps for r in self.regions)
        base = self.prfaas_base
        topo = replace(base, name=f"{base.name} (PrfaaS side)", workers=workers + decoders,
                       link=LinkSpec(rate, base.link.connections, "netns",
                                     wire_dtype=base.link.wire_dtype))
        path = self.log_dir / "prfaas.yaml"
        topo.dump(path)
        for w in workers:
            self._spawn(w.name, ns.wrap([sys.executable, "-m", "prfaas.serve.deploy.proc",
                                         "--topology", str(path), "--name", w.name]), {})
        # each tenant's KV leaves through its own veth: the gateway meters that interface
        tenants = tuple(replace(t, link_interface=f"pfn{self.links[t.name].index}")
                        for t in self.gateway_base.tenants)
        gw = replace(self.gateway_base, tenants=tenants,
                     workers=tuple(f"http://127.0.0.1:{w.port}" for w in workers),
                     host="0.0.0.0", port=self.gateway_port)
        config = self.log_dir / "gateway.json"
        config.write_text(json.dumps(gw.to_json(), indent=1))
        env = {t.key_env: r.key for t, r in zip(gw.tenants, self.regions, strict=True)}
        self._spawn(GATEWAY, ns.wrap([sys.executable, "-m", "prfaas.serve.gateway",
                                      "--config", str(config)]), env)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
        log.close()

    def _wait_gateway(self) -> None:
        url = self.gateway_url(self.regions[0].name)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise DeploymentError(f"{name} exited with code {proc.returncode}:\n"
                                          f"{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise DeploymentError(f"the PrfaaS gateway not healthy after "
                                      f"{self.start_timeout_s:.0f} s:\n{self.log_tail(GATEWAY)}")
            time.sleep(0.2)

    def log_tail(self, name: str, num_bytes: int = 3000) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""

    def partition(self, region: str, down: bool = True) -> None:
        """Region `region`'s link down (nothing crosses it) or up again."""
        self.links[region].set_up(not down)

    def pids(self) -> list[int]:
        out = [p.pid for p in self.procs.values()]
        for dep in self.deployments.values():
            out += [p.pid for p in (dep.supervisor.procs() or dep.procs).values()]
        return out

    def stop(self, timeout_s: float = 5.0) -> None:
        """Everything at once: the PrfaaS side and every region, each SIGTERM then SIGKILL
        after `timeout_s`."""
        terminate(self.procs.values())

        def stop_region(dep: Deployment) -> None:
            try:
                dep.stop(timeout_s)
            except (subprocess.TimeoutExpired, OSError) as exc:
                print(f"warning: stopping a region: {exc}", file=sys.stderr)

        with ThreadPoolExecutor(max(len(self.deployments), 1)) as pool:
            list(pool.map(stop_region, self.deployments.values()))
        reap(self.procs.values(), timeout_s)
        self.procs.clear()
        if self.links:
            first = self.links[self.regions[0].name]
            first.destroy()  # the namespace, and with it every veth pair
            for link in self.links.values():
                subprocess.run(["ip", "link", "del", f"pfh{link.index}"], capture_output=True,
                               timeout=20, check=False)
            self.links.clear()
        if self._own_log_dir:
            import shutil

            shutil.rmtree(self.log_dir, ignore_errors=True)
