"""The router's view of an emulated deployment: planner inputs from the system's own pools,
KV bytes from the emulated layout, link capacity from telemetry."""

import pytest

from prfaas.emulated.topology import emulated_system
from prfaas.serve.cluster import LiveCluster
from prfaas.serve.model import engine_config, kv_geometry
from prfaas.serve.plan import live_plan_inputs


def test_controller_plans_with_the_scaled_scenarios_pools() -> None:
    es = emulated_system("paper-case-study", "prfaas_pd", link_emulation="token-bucket",
                         policy="prfaas-threshold+controller")
    inputs = live_plan_inputs(es.topology)
    s = es.scaled.scenario
    assert inputs.prfaas_prefill == s.prfaas.hardware.prefill  # H200, not one profile for both
    assert inputs.pd_prefill == s.pd.hardware.prefill
    assert inputs.prfaas_prefill != inputs.pd_prefill
    assert (inputs.n_prfaas, inputs.n_pd) == (4, 8)
    assert inputs.link_gbps == pytest.approx(s.link_gbps)


def test_router_predicts_the_bytes_the_workers_ship_and_hears_the_link() -> None:
    es = emulated_system("paper-case-study", "prfaas_pd", link_emulation="token-bucket")
    geo = kv_geometry(es.topology.model, engine_config(es.topology.model))
    assert geo.size_bytes(1000) == es.scaled.layout.size_bytes(1000)
    cluster = LiveCluster(es.topology, geo)
    assert cluster.view().link().capacity_gbps == pytest.approx(es.topology.link.rate_gbps)
    cluster.capacity_gbps = 0.1
    assert cluster.view().link().capacity_gbps == 0.1
    assert cluster.view().kv_transfer_s(1000) == pytest.approx(geo.size_bytes(1000) * 8 / 1e8)
