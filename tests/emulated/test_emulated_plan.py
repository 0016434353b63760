"""The router's view of an emulated deployment: planner inputs from the system's own pools,
KV bytes from the emulated layout, link capacity from telemetry."""

import pytest

from prfaas.emulated.topology import emulated_system
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.router.plan import live_plan_inputs


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
    geo = engine_backend(es.topology).card().kv
    assert geo.size_bytes(1000) == es.scaled.layout.size_bytes(1000)
    cluster = LiveCluster(es.topology, geo)
    assert cluster.view().link().capacity_gbps == pytest.approx(es.topology.link.rate_gbps)
    cluster.capacity_gbps = 0.1
    assert cluster.view().link().capacity_gbps == 0.1
    assert cluster.view().kv_transfer_s(1000) == pytest.approx(geo.size_bytes(1000) * 8 / 1e8)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_router_predicts_prefill_work_as_the_simulator_does() -> None:
    """The emulated workers' hardware profiles are the router's cost models (T(l) quadratic,
    as the simulator's router reads it), corrected by measured / predicted; a worker's queued
    work is its predicted drain time (FIFO), not the sum of what it was ever sent."""
    es = emulated_system("paper-case-study", "homogeneous_pd", link_emulation="token-bucket")
    models = engine_backend(es.topology).prefill_models()
    profile = es.scaled.scenario.homogeneous.hardware.require_prefill()
    assert set(models) == {w.name for w in es.topology.workers if w.is_prefill}
    assert all(m == profile for m in models.values())
    clock = Clock()
    cluster = LiveCluster(es.topology, engine_backend(es.topology).card().kv, models, clock)
    short, long = cluster.prefill_time_s("pdp-0", 1000, 0), cluster.prefill_time_s("pdp-0",
                                                                                    16000, 0)
    assert short == pytest.approx(profile.seconds(1000))
    assert long == pytest.approx(profile.seconds(16000))
    assert abs(long / short / 16 - 1) > 0.03  # a per-token rate learned on one is off
    cluster.measured("pdp-0", 1.1 * short, 1000, 0)  # the worker ran 10% slow
    assert cluster.prefill_time_s("pdp-0", 1000, 0) == pytest.approx(short * 1.02)

    def queued() -> float:
        return next(i.queued_work_s for i in cluster.view().instances() if i.instance_id ==
                    "pdp-1")

    cluster.start("pdp-1", 1.0)
    cluster.start("pdp-1", 2.0)
    assert queued() == pytest.approx(3.0)
    clock.t += 0.5
    assert queued() == pytest.approx(2.5)  # the running prefill is half done
    clock.t += 0.7  # it took 1.2 s: the next one starts now
    cluster.finish("pdp-1", 1.0)
    assert queued() == pytest.approx(2.0)
    clock.t += 5.0  # later than predicted, still running: nothing is known to be left
    assert queued() == 0.0
    cluster.finish("pdp-1", 2.0)
    cluster.start("pdp-1", 0.5)  # an idle worker: the new one starts at once
    assert queued() == pytest.approx(0.5)

