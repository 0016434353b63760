"""`link.emulation: netns`: the PrfaaS worker in its own network namespace behind a veth
shaped by `tc tbf`, so its KV crosses a kernel rate limit (needs root and iproute2; the test is
skipped where a namespace cannot be created, e.g. without root)."""

from __future__ import annotations

import time

import pytest
from serve_helpers import complete, topology

from prfaas.engine import Engine, EngineConfig
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.netns import NetnsError, NetnsLink, namespaces, netns_available

RATE_GBPS = 0.02  # 20 Mbit/s: a ~1.3 MB KV takes ~0.5 s, far above loopback noise


def _can_create() -> bool:
    if not netns_available():
        return False
    try:
        NetnsLink.create(RATE_GBPS, index=249).destroy()
    except NetnsError:
        return False
    return True


needs_netns = pytest.mark.skipif(not _can_create(),
                                 reason="cannot create a network namespace here (needs root)")


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
