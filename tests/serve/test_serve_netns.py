"""`link.emulation: netns`: the PrfaaS worker in its own network namespace behind a veth
shaped by `tc tbf`, so its KV crosses a kernel rate limit (the netns feature, tests/needs.py:
CAP_NET_ADMIN and CAP_SYS_ADMIN, `ip` and `tc`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from serve_helpers import complete, topology

from needs import needs
from prfaas.engine import Engine, EngineConfig
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.netns import NetnsError, NetnsLink, namespaces

RATE_GBPS = 0.02  # 20 Mbit/s: a ~1.3 MB KV takes ~0.5 s, far above loopback noise

needs_netns = needs("netns")


@needs_netns
def test_kv_crosses_a_kernel_shaped_link_and_outputs_stay_exact(tmp_path) -> None:
    topo = topology(link={"rate_gbps": RATE_GBPS, "connections": 4, "emulation": "netns"})
    prompt = "Kernel-shaped link, long prompt. " * 30  # ~1K tokens: above t, routed to PrfaaS
    with Deployment(topo, log_dir=tmp_path) as dep:
        assert dep.netns is not None and dep.netns.name in namespaces()
        name = dep.netns.name
        assert dep.topology.worker("prfaas-0").host == dep.netns.ns_ip
        start = time.perf_counter()
        reply = complete(dep.url, prompt, max_tokens=4)
        elapsed_s = time.perf_counter() - start
        info = reply["prfaas"]
        assert info["route"] == "prfaas" and info["prefill_node"] == "prfaas-0"
        # the KV really crossed the 20 Mbit/s veth: no faster than the rate allows
        # (the prefill overlaps the transfer, so the whole request bounds it from above)
        min_transfer_s = info["kv_bytes"] * 8 / (RATE_GBPS * 1e9)
        assert min_transfer_s > 0.3
        assert elapsed_s >= 0.9 * min_transfer_s
    engine = Engine(EngineConfig.tiny(threads=1))
    assert info["token_ids"] == engine.generate(engine.tokenizer.encode(prompt), 4)
    assert name not in namespaces()  # stop() removed it (others' tests may hold their own)


def test_netns_needs_a_rate() -> None:
    from prfaas.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"link\.rate_gbps"):
        topology(link={"rate_gbps": None, "emulation": "netns"})
    with pytest.raises(ConfigError, match=r"link\.emulation"):
        topology(link={"rate_gbps": 1.0, "emulation": "carrier-pigeon"})


@needs_netns
def test_a_taken_index_fails_without_removing_its_owners_link() -> None:
    """Another process asking for the index this one's link holds fails (its `ip link add`
    finds the veth pair), and leaves the pair and the namespace in place: the probe used to
    delete them while cleaning up after itself. The same in this process (its namespace name
    is the one taken). Negative control: the owner's own destroy does remove them."""
    owner = NetnsLink.create(RATE_GBPS)
    try:
        code = ("from prfaas.serve.deploy.netns import NetnsLink, NetnsError\n"
                f"try: NetnsLink.create({RATE_GBPS}, index={owner.index})\n"
                "except NetnsError as e: print('refused:', e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120).stdout
        assert out.startswith("refused:") and "ip link add" in out and "File exists" in out, out
        with pytest.raises(NetnsError, match="File exists"):
            NetnsLink.create(RATE_GBPS, index=owner.index)
        assert os.path.exists(f"/sys/class/net/pfh{owner.index}")
        assert owner.name in namespaces()
        assert [n for n in namespaces() if n.endswith(f"-{owner.index}")] == [owner.name]
    finally:
        owner.destroy()
    assert not os.path.exists(f"/sys/class/net/pfh{owner.index}")


@needs_netns
def test_an_index_taken_between_check_and_create_moves_on_to_the_next(monkeypatch) -> None:
    """The race two test workers ran into: the free index another process takes before this
    one's `ip link add` makes create try the next one, not fail."""
    from prfaas.serve.deploy import netns

    held = NetnsLink.create(RATE_GBPS)
    real = netns.free_index
    calls: list[int] = []

    def stale(start: int, used: set[int] | frozenset[int] = frozenset()) -> int:
        calls.append(start)  # the first answer is the index `held` has (a stale check)
        return held.index if len(calls) == 1 else real(start, used)

    monkeypatch.setattr(netns, "free_index", stale)
    try:
        link = NetnsLink.create(RATE_GBPS)
        try:
            assert link.index != held.index and len(calls) == 2
            assert os.path.exists(f"/sys/class/net/pfh{held.index}")
        finally:
            link.destroy()
    finally:
        held.destroy()


@needs_netns
def test_links_from_two_processes_at_once_all_succeed() -> None:
    """Two processes (two test workers, two deployments) each creating and removing links at
    once: every create finds a free index (with a fixed index both would fail)."""
    code = ("from prfaas.serve.deploy.netns import NetnsLink\n"
            "for _ in range(5): NetnsLink.create(0.01).destroy()\n"
            "print(True)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["True", "True"]
