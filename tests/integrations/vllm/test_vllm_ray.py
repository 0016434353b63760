"""Live: vLLM instances on a 3-node Ray cluster (every node on 127.0.0.1) behind the prfaas router,
both routes, greedy tokens exactly those of `prfaas generate --engine vllm`.

The tiny Llama topology (topologies/vllm-local-llama.yaml, bit-exact P/D) with a `ray:` section:
prfaas-0 on the dc_prfaas node, pdp-0 and pdd-0 on dc_local, the router on the head. Each is a
ComponentActor (serve/deploy/ray/actor.py) owning a vLLM server and its PrfaasConnector; the
PrfaaS route's KV crosses between Ray nodes (prfaas-0's node -> pdd-0's) over prfaas's own
transport. The reference is one standalone vLLM engine on the same model and arguments
(integrations/vllm/reference.py: what `prfaas generate --engine vllm` starts), one core.
Checks: placement by Ray node id; every worker and the router on 127.0.0.1; short prompts routed
pd, long ones prfaas on prfaas-0, each reply's tokens equal to the reference's (a control:
another prompt's reference differs, so equality can fail); KV bytes on the PrfaaS route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from needs import needs

pytestmark = [needs("vllm", "ray"), pytest.mark.timeout(1800)]

from vllm_live import build, members, prompts, routed, topology, workdir  # noqa: E402

# below t = 1024 (pd), above it and past max_num_batched_tokens (prfaas, chunked prefill)
SHORT, LONG = [60, 300, 900], [1100, 1500, 2600]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def on_ray() -> Iterator[dict[str, Any]]:
    from prfaas.integrations.vllm.reference import reference_spec
    from prfaas.integrations.vllm.server import VllmInstance
    from prfaas.serve.deploy.ray.deployment import RayDeployment
    from prfaas.serve.deploy.ray.loopback import loopback_cluster
    from prfaas.serve.deploy.ray.spec import RaySpec
    from prfaas.serve.ports import free_port

    with workdir("vllm-ray") as root:
        model = build("llama", root)
        topo = topology("vllm-local-llama.yaml", model)
        topo = dataclasses.replace(topo, workers=tuple(
            dataclasses.replace(w, host="127.0.0.1") for w in topo.workers))
        assert topo.vllm is not None
        ref = VllmInstance(reference_spec(topo.vllm, free_port(), cores="1"),
                           root / "reference.log")
        ref.spawn()
        try:
            with loopback_cluster() as cluster, \
                    RayDeployment(topo, RaySpec(), cluster.address, start_timeout_s=900,
                                  log_dir=str(root / "logs")) as dep:
                ref.wait_ready(900)
                yield {"dep": dep, "nodes": cluster.nodes, "ref": ref, "root": root}
        finally:
            ref.stop()


def _reference(live: dict[str, Any], prompt: list[int]) -> list[int]:
    from prfaas.integrations.vllm.reference import complete

    ids: list[int] = complete(live["ref"].spec.url, "tiny", prompt, MAX_TOKENS)["token_ids"]
    return ids


def test_vllm_on_ray_serves_both_routes_exactly(on_ray: dict[str, Any]) -> None:
    dep, nodes = on_ray["dep"], on_ray["nodes"]
    url = dep.url
    assert url.startswith("http://127.0.0.1:")
    # where Ray placed each instance's actor (a vLLM server's own /health carries no node id,
    # so the router's view has none for it); the router sees every instance up
    placed = dep.info()
    assert placed["prfaas-0"]["node_id"] == nodes["dc_prfaas"]
    assert placed["pdp-0"]["node_id"] == placed["pdd-0"]["node_id"] == nodes["dc_local"]
    assert all(m["up"] for m in members(url).values())
    assert all(w.host == "127.0.0.1" for w in dep.topology.workers)
    short, long_ = prompts(SHORT, seed=31), prompts(LONG, seed=32)
    mismatches = []
    kv_bytes = 0
    for route, batch in (("pd", short), ("prfaas", long_)):
        for prompt in batch:
            want = _reference(on_ray, prompt)
            p = routed(url, prompt, MAX_TOKENS)["prfaas"]
            assert p["route"] == route and not p["retried"], p
            if route == "prfaas":
                assert p["prefill_node"] == "prfaas-0" and p["decode_node"] == "pdd-0"
                kv_bytes += p["kv_bytes"]
            if p["token_ids"] != want:
                mismatches.append((len(prompt), route, p["token_ids"], want))
    assert not mismatches, mismatches
    assert kv_bytes > 0  # the PrfaaS route's KV crossed from prfaas-0's Ray node to pdd-0's
    # the control: the reference of another prompt differs (equality above could fail)
    assert _reference(on_ray, short[0]) != _reference(on_ray, short[1])
