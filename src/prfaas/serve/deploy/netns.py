"""A kernel-shaped inter-datacenter link: the PrfaaS workers in their own network namespace.

With `link: {emulation: netns}` the launcher creates a namespace joined to this host by a veth
pair and shapes the namespace side's egress with `tc tbf` (netem is not available on these
kernels, so there is no added latency: only the rate). The PrfaaS workers run inside it
(`ip netns exec`), so their KV really crosses a rate-limited TCP link: one shaper for every
PrfaaS worker together (unlike the per-sender token bucket), with real queueing, drops and
retransmissions (visible in TCP_INFO). Needs root and iproute2; `netns_available()` says
whether this host can.

Faults (serve/deploy/faults.py) act on a live link: `set_rate` changes the tbf rate, `set_up(False)`
takes the namespace end of the veth down (a partition; these hosts have no iptables/nft, and
no tc drop action module).

Addresses: host side 10.231.<k>.1/30 (the decode workers bind there, so both the host and the
namespace reach them), namespace side 10.231.<k>.2/30 (the PrfaaS workers). Router -> PrfaaS
control traffic goes host -> namespace, unshaped; KV goes namespace -> host, shaped.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from prfaas.core.errors import PrfaasError

PREFIX = "prfaas"
_SERIAL = itertools.count()


class NetnsError(PrfaasError):
    """A namespace, veth or qdisc could not be set up (the command and its stderr)."""


class _IndexTaken(NetnsError):
    """The namespace or veth pair of an index is already there: another link holds it."""


_CREATE_TRIES = 8


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")


def _tbf(rate_gbps: float) -> list[str]:
    rate_kbit = max(int(rate_gbps * 1e6), 8)
    # burst: >= one 10 ms tick at the rate and >= a few MTUs; 100 ms of queue before drops
    burst_bytes = max(rate_kbit * 1000 // 8 // 100, 16 * 1514)
    return ["tbf", "rate", f"{rate_kbit}kbit", "burst", str(burst_bytes), "latency", "100ms"]


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # veth/tc; `ip netns add` mounts under /run/netns


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def netns_available() -> bool:
    """CAP_NET_ADMIN and CAP_SYS_ADMIN (root in a container may lack them), `ip` and `tc`
    present; `create` still reports what the kernel refuses, command and stderr."""
    caps = _effective_caps()
    return (bool(caps >> CAP_NET_ADMIN & 1) and bool(caps >> CAP_SYS_ADMIN & 1)
            and shutil.which("ip") is not None and shutil.which("tc") is not None)


def free_index(start: int, used: set[int] | frozenset[int] = frozenset()) -> int:
    """The first index from `start` on (1..240, wrapping) that is neither in `used` nor the
    host end of a veth that exists now: another process's deployment on this host (a second
    test worker, a second `prfaas serve`) may hold the index its pid led to."""
    k = start
    for _ in range(240):
        if k not in used and not os.path.exists(f"/sys/class/net/pfh{k}"):
            return k
        k = k % 240 + 1
    raise NetnsError("no free veth index in 1..240 (240 prfaas links exist on this host)")


@dataclass
class NetnsLink:
    """One shaped namespace; `create` builds it, `destroy` removes it (and the veth pair)."""

    name: str
    index: int
    rate_gbps: float
    # what this link made and so may remove (create sets them as each step succeeds)
    _owns_ns: bool = field(default=True, repr=False)
    _owns_veth: bool = field(default=True, repr=False)

    @property
    def host_ip(self) -> str:
        return f"10.231.{self.index}.1"

    @property
    def ns_ip(self) -> str:
        return f"10.231.{self.index}.2"

    @classmethod
    def create(cls, rate_gbps: float, index: int | None = None) -> NetnsLink:
        """A shaped namespace at veth `index`, or (None) at a free one. Another process may
        take the free index between the check and `ip link add` (two test workers starting
        links at once): with no index given the next free one is tried, a few times."""
        if not netns_available():
            raise NetnsError("link.emulation=netns needs CAP_NET_ADMIN and CAP_SYS_ADMIN (root), "
                             "`ip` and `tc` on this host")
        if index is not None:
            return cls._create_at(rate_gbps, index)
        # a fresh index per link in this process, starting from its pid (two processes apart)
        start = (os.getpid() + next(_SERIAL)) % 240 + 1
        taken: set[int] = set()
        for _ in range(_CREATE_TRIES):
            k = free_index(start, taken)
            try:
                return cls._create_at(rate_gbps, k)
            except _IndexTaken:
                taken.add(k)
                start = k % 240 + 1
        raise NetnsError(f"no veth index could be taken after {_CREATE_TRIES} tries "
                         f"(other processes took {sorted(taken)} first)")

    @classmethod
    def _create_at(cls, rate_gbps: float, k: int) -> NetnsLink:
        link = cls(f"{PREFIX}-{os.getpid()}-{k}", k, rate_gbps, _owns_ns=False, _owns_veth=False)
        try:
            link._build()
        except BaseException:  # remove what this call made, never another link's pieces
            link.destroy()
            raise
        return link

    def _build(self) -> None:
        host_if, ns_if = f"pfh{self.index}", f"pfn{self.index}"
        try:
            _run("ip", "netns", "add", self.name)
            self._owns_ns = True
            _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            self._owns_veth = True
        except NetnsError as e:
            if "File exists" in str(e):
                raise _IndexTaken(str(e)) from e
            raise
        _run("ip", "link", "set", ns_if, "netns", self.name)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        inside = ("ip", "netns", "exec", self.name)
        _run(*inside, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", ns_if)
        _run(*inside, "ip", "link", "set", ns_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "tc", "qdisc", "add", "dev", ns_if, "root", *_tbf(self.rate_gbps))

    def set_rate(self, rate_gbps: float) -> None:
        """Reshape the KV direction to `rate_gbps` now (a fault: the link slows down)."""
        _run("ip", "netns", "exec", self.name, "tc", "qdisc", "change", "dev",
             f"pfn{self.index}", "root", *_tbf(rate_gbps))

    def set_up(self, up: bool) -> None:
        """Take the namespace end of the veth down (a partition) or up again. The host end
        stays up without carrier, so the host keeps routing the namespace's address into the
        veth, where it is dropped silently (nothing leaves the host)."""
        _run("ip", "netns", "exec", self.name, "ip", "link", "set", f"pfn{self.index}",
             "up" if up else "down")

    def route_via_host(self) -> None:
        """A default route out of the namespace through the host end, so a process inside
        reaches the host's own addresses (a Ray node there binds the host's primary address,
        not the veth's); the host does the rest as for any local address."""
        _run("ip", "netns", "exec", self.name, "ip", "route", "add", "default", "via",
             self.host_ip)

    def qdisc_sent_bytes(self) -> int:
        """Bytes the namespace side's tbf qdisc has sent (tc's own counter of the shaper)."""
        done = subprocess.run(["ip", "netns", "exec", self.name, "tc", "-s", "qdisc", "show",
                               "dev", f"pfn{self.index}"], capture_output=True, text=True,
                              timeout=20, check=True)
        words = done.stdout.split()
        return int(words[words.index("Sent") + 1])

    def carried_bytes(self) -> int:
        """Bytes the shaped direction has delivered so far: the host end's receive counter
        (what left the namespace through tbf: KV, plus TCP/IP headers and the PrfaaS workers'
        small HTTP replies)."""
        with open(f"/sys/class/net/pfh{self.index}/statistics/rx_bytes") as f:
            return int(f.read())

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def destroy(self) -> None:
        """Remove the namespace (its veth end goes with it, and the host end with the pair);
        a namespace or veth pair this link failed to create belongs to someone else and stays."""
        if self._owns_ns:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20,
                           check=False)
        if self._owns_veth:
            subprocess.run(["ip", "link", "del", f"pfh{self.index}"], capture_output=True,
                           timeout=20, check=False)


def namespaces() -> list[str]:
    """prfaas namespaces that exist now (tests check that nothing leaks)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20,
                          check=False)
    return [line.split()[0] for line in done.stdout.splitlines()
            if line.startswith(f"{PREFIX}-")]
