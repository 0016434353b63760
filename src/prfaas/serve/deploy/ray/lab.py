"""Two Ray clusters on this host, one per datacenter, the PrfaaS one behind a shaped link.

`TwoDatacenters(rate_gbps)` makes a network namespace joined to the host by a veth pair whose
namespace side is shaped by `tc tbf` (netns.py, the live link's own helper), starts the PrfaaS
cluster's Ray head *inside* it (`ray start --head --block` under `ip netns exec`, resource
`dc_prfaas`) and the local cluster's head on the host (`dc_local` and `router`, at the host
end of the veth). Each head is a child process stopped by its pid (SIGTERM; `ray start
--block` then stops the raylet, GCS and workers it started), never `ray stop`, which would end
every Ray process on the host. Every port is chosen here: the namespace's are its own (a
private network stack), the host's are free ports above 20000 (Ray's worker ports are
10002-19999). No usage statistics are sent.

The local cluster is reached by its GCS address (this host is its node); the PrfaaS cluster by
Ray Client (`ray://NS_IP:PORT`), as a driver in the other datacenter would reach it. Between
the two only prfaas's KV link and the router's calls to the PrfaaS workers cross the veth (plus
the Ray Client connection of the deployment's driver, which a production driver has too).

`python -m prfaas.serve.deploy.ray.lab` starts both, prints the `prfaas serve` command for them
and the link's counters, and stops everything on Ctrl-C (needs root, `ip`, `tc`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from prfaas.serve.deploy.netns import NetnsLink
from prfaas.serve.deploy.ray.part import NO_USAGE_STATS
from prfaas.serve.ports import free_ports

NODE_BYTES = 80 * 2**20
PORT_FLAGS = ("--port", "--ray-client-server-port", "--dashboard-port",
              "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
              "--node-manager-port", "--object-manager-port")
NS_BASE_PORT = 26400  # inside the namespace nothing else listens


def session_members(sid: int) -> list[int]:
    """Pids of the live processes in session `sid` (the head's children, grandchildren...)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


@dataclass
class RayHead:
    """A one-node Ray cluster: `ray start --head --block` as a child of this process."""

    resources: dict[str, float]
    netns: NetnsLink | None = None
    num_cpus: int = 1
    ip: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    temp_dir: str = ""

    def start(self) -> None:
        if self.netns is not None:
            self.ip = self.netns.ns_ip
            numbers = list(range(NS_BASE_PORT, NS_BASE_PORT + len(PORT_FLAGS)))
            workers = (NS_BASE_PORT + 20, NS_BASE_PORT + 120)
        else:  # `ip` given (the veth's host end), never Ray's choice of the host's address
            numbers = free_ports(len(PORT_FLAGS), "0.0.0.0")
            workers = (10002, 19999)  # Ray's default range
        self.ports = dict(zip(PORT_FLAGS, numbers, strict=True))
        self.temp_dir = tempfile.mkdtemp(prefix="pfr", dir="/tmp")  # short: Unix socket paths
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        cmd = [ray_bin, "start", "--head", "--block", "--disable-usage-stats",
               "--include-dashboard", "false", "--num-cpus", str(self.num_cpus),
               "--object-store-memory", str(NODE_BYTES), "--resources",
               json.dumps(self.resources), "--temp-dir", self.temp_dir,
               "--min-worker-port", str(workers[0]), "--max-worker-port", str(workers[1])]
        for flag, number in self.ports.items():
            cmd += [flag, str(number)]
        if self.ip:
            cmd += ["--node-ip-address", self.ip]
        if self.netns is not None:
            cmd = self.netns.wrap(cmd)
        with open(os.path.join(self.temp_dir, "head.log"), "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **NO_USAGE_STATS},
                                         start_new_session=True)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until the GCS and the Ray Client server accept connections."""
        host = self.ip or "127.0.0.1"
        deadline = time.monotonic() + timeout_s
        for flag in ("--port", "--ray-client-server-port"):
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"ray head exited ({self.proc.returncode}):\n"
                                       f"{self.log_tail()}")
                try:
                    socket.create_connection((host, self.ports[flag]), 0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"ray head not up in {timeout_s:.0f} s:\n"
                                           f"{self.log_tail()}") from None
                    time.sleep(0.1)

    @property
    def gcs_address(self) -> str:
        return f"{self.ip or '127.0.0.1'}:{self.ports['--port']}"

    @property
    def client_address(self) -> str:
        return f"ray://{self.ip or '127.0.0.1'}:{self.ports['--ray-client-server-port']}"

    def log_tail(self, num_bytes: int = 3000) -> str:
        path = os.path.join(self.temp_dir, "head.log")
        if not os.path.exists(path):
            return ""
        with open(path, "rb") as f:
            return f.read()[-num_bytes:].decode(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # ray start --block stops what it started
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:  # anything of its session left (a worker ignoring SIGTERM)
            for pid in session_members(self.proc.pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class TwoDatacenters:
    link: NetnsLink
    prfaas: RayHead  # inside the namespace: resource dc_prfaas
    local: RayHead  # on the host: resources dc_local and router

    def ray_args(self) -> list[str]:
        """`prfaas serve` arguments for these two clusters."""
        return ["--ray", f"dc_prfaas={self.prfaas.client_address}",
                "--ray", f"dc_local={self.local.gcs_address}"]


@contextmanager
def two_datacenters(rate_gbps: float, index: int | None = None) -> Iterator[TwoDatacenters]:
    link = NetnsLink.create(rate_gbps, index)
    heads: list[RayHead] = []
    try:
        link.route_via_host()
        prfaas = RayHead({"dc_prfaas": 1}, netns=link)
        # the local cluster's node at the veth's host end: reachable from the namespace (its
        # PrfaaS workers ship KV to the decoders), never the host's interface address
        local = RayHead({"dc_local": 1, "router": 1}, ip=link.host_ip)
        heads += [prfaas, local]
        for head in heads:  # both start at once
            head.start()
        for head in heads:
            head.wait_ready()
        yield TwoDatacenters(link, prfaas, local)
    finally:
        for head in heads:
            head.stop()
        link.destroy()


def main() -> None:
    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2
    with two_datacenters(rate) as dcs:
        print(f"PrfaaS cluster in namespace {dcs.link.name} at {dcs.prfaas.client_address}; "
              f"local cluster at {dcs.local.gcs_address}; link {rate} Gbps (tbf)")
        print("prfaas serve --topology topologies/ray-two-dc.yaml " + " ".join(dcs.ray_args()))
        try:
            while True:
                time.sleep(5)
                print(f"link: {dcs.link.carried_bytes()} bytes carried (veth rx), "
                      f"{dcs.link.qdisc_sent_bytes()} sent by tbf", flush=True)
        except KeyboardInterrupt:
            print("stopping")


if __name__ == "__main__":
    main()
