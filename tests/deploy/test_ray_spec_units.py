"""`--ray` values and which cluster each component goes to (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.serve.deploy.ray.spec import load_ray_topology, parse_ray_addresses

ROOT = Path(__file__).resolve().parents[2]


def test_one_address_or_one_per_datacenter() -> None:
    assert parse_ray_addresses(("10.0.0.1:6379",)) == "10.0.0.1:6379"
    assert parse_ray_addresses(("dc_prfaas=ray://a:10001", "dc_local=b:6379")) == {
        "dc_prfaas": "ray://a:10001", "dc_local": "b:6379"}
    for bad, word in ((("a:1", "dc_local=b:2"), "RESOURCE=ADDRESS"),
                      (("dc_local=a:1", "dc_local=b:2"), "given twice"),
                      (("=a:1",), "RESOURCE=ADDRESS"), ((), "needs an address")):
        with pytest.raises(ConfigError, match=word):
            parse_ray_addresses(bad)


def test_components_go_to_their_datacenters_cluster() -> None:
    topo, spec = load_ray_topology(ROOT / "topologies" / "ray-two-dc.yaml")
    two = {"dc_prfaas": "ray://p:10001", "dc_local": "l:6379"}
    assert spec.clusters(topo, two) == {"ray://p:10001": ["prfaas-0"],
                                        "l:6379": ["pdp-0", "pdd-0", "router"]}
    # the router's own resource, when keyed, wins over the local DC's cluster
    assert spec.clusters(topo, {**two, "router": "r:6379"})["r:6379"] == ["router"]
    with pytest.raises(ConfigError, match="no cluster for prfaas-0"):
        spec.clusters(topo, {"dc_local": "l:6379"})
