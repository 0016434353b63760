"""The live router's ranked view (serve/router/live_pool.py): after random starts, finishes,
measurements and workers going down and up, every decision of the shipped policies on the
ranked pools equals the decision on a plain scan of the same loads; a pool that misses one
change is caught (negative control)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from prfaas.core.types import InstanceLoad, RequestInfo, Role, RouteQuery
from prfaas.models.profile import PrefillTime
from prfaas.policy.base import make_router
from prfaas.scenario import load_scenario
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.cluster import LiveCluster, LiveView
from prfaas.serve.topology import WorkerSpec, load_topology


class ScanView(LiveView):
    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        return list(super().instances(cluster, role))


def _cluster(rng: random.Random, clock: list[float], models: bool) -> LiveCluster:
    specs = ([WorkerSpec(f"prfaas-{i}", "prfaas") for i in range(rng.choice([2, 9]))]
             + [WorkerSpec(f"pdp-{i}", "pd-p") for i in range(rng.choice([1, 7, 30]))]
             + [WorkerSpec(f"pdd-{i}", "pd-d", max_batch=rng.choice([2, 4]))
                for i in range(rng.choice([1, 6]))])
    topo = replace(load_topology(), workers=tuple(specs))
    profiles: dict[str, PrefillTime] = {}
    if models:
        s = load_scenario("paper-case-study")
        for w in specs:
            if w.role != "pd-d":
                hw = s.hardware["h200" if w.role == "prfaas" else "h20"]
                assert hw.prefill is not None
                profiles[w.name] = hw.prefill
    return LiveCluster(topo, engine_backend(topo).card().kv, profiles,
                       clock=lambda: clock[0])


def _run(seed: int, steps: int, skip_at: int | None = None) -> int:
    rng = random.Random(seed)
    clock = [50.0]
    cluster = _cluster(rng, clock, models=seed % 2 == 0)
    names = list(cluster.loads)
    prefill = [n for n in names if cluster.loads[n].spec.is_prefill]
    policies = [make_router("prfaas-threshold", threshold_tokens=3000),
                make_router("cache-aware", threshold_tokens=3000),
                make_router("all-pd"), make_router("load-balance")]
    differ = 0
    for step in range(steps):
        clock[0] += rng.choice([0.0, 0.0, 0.01, 0.2, 1.0])
        name = rng.choice(names)
        load = cluster.loads[name]
        op = rng.random()
        pool = cluster._pool_of(load)
        if step == skip_at:  # the negative control: a change the pool is not told about
            load.inflight += 1
            load.busy_until = clock[0] + 7.0
        elif op < 0.45:
            cluster.start(name, rng.choice([0.0, 0.5, 2.0]) if load.spec.is_prefill else 0.0)
        elif op < 0.8 and load.inflight:
            cluster.finish(name, rng.choice([0.0, 0.5]))
        elif op < 0.9 and load.spec.is_prefill:
            cluster.measured(name, rng.choice([0.3, 1.1, 2.5]), rng.choice([1200, 9000]),
                             rng.choice([0, 200]))
        else:
            down = set(cluster.down)
            down.symmetric_difference_update({name})
            cluster.down = frozenset(down)
        assert pool is cluster._pool_of(load)
        total = rng.choice([300, 5000, 40000])
        held = {n: rng.choice([0, 256, total]) for n in rng.sample(prefill, k=min(
            len(prefill), rng.choice([0, 0, 2])))}
        query = RouteQuery(RequestInfo(str(step), total, 8, 0.0), held)
        now = clock[0]
        for policy in policies:
            fast = policy.route(query, LiveView(cluster, now - 50.0, now))
            slow = policy.route(query, ScanView(cluster, now - 50.0, now))
            differ += fast != slow
    return differ


@pytest.mark.parametrize("seed", range(6))
def test_live_ranked_view_decides_as_a_scan(seed: int) -> None:
    assert _run(seed, 300) == 0


def test_a_change_the_pool_missed_is_caught() -> None:
    assert sum(_run(seed, 300, skip_at=k) for seed in range(4) for k in (3, 40)) > 0
