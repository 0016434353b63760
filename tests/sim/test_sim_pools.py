"""The ranked cluster view (core/pool.py, sim/pools.py): on random sequences of state changes,
every shipped decision helper reads the ranking and decides exactly as a full scan of the same
loads (names included); a pool whose ranking misses one state change does not."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    InstanceLoad,
    LinkStatus,
    RequestInfo,
    Role,
    RouteQuery,
    best_cached,
)
from prfaas.models.profile import PrefillTime
from prfaas.policy.base import pick_decode, pick_prefill
from prfaas.policy.cache_aware import _holder, place
from prfaas.scenario import load_scenario
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.pools import DecodePool, PrefillPool
from prfaas.sim.system import build_system


class FakeView:
    """A ClusterView over one prefill pool and one decode pool; `scan` shows them as lists."""

    def __init__(self, prefill: PrefillPool, decode: DecodePool, clock: list[float],
                 scan: bool) -> None:
        self.prefill, self.decode, self.clock, self.scan = prefill, decode, clock, scan
        self.profiles: dict[str, PrefillTime] = {}

    @property
    def now_s(self) -> float:
        return self.clock[0]

    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        pool = self.prefill if role == "prefill" else self.decode
        return pool.loads() if self.scan else pool

    def link(self) -> LinkStatus:
        return LinkStatus(100.0)

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        return self.profiles[instance_id].seconds(total_tokens, cached_tokens)

    def kv_transfer_s(self, tokens: int) -> float:
        return tokens * 2e-5


def _decisions(rng: random.Random, view: FakeView, names: list[str]) -> list[object]:
    total = rng.choice([200, 4096, 30000, 100000])
    held = rng.sample(names, k=min(len(names), rng.choice([0, 0, 1, 3])))
    cached = {n: rng.choice([0, 512, 4096, total, total + 5]) for n in held}
    query = RouteQuery(RequestInfo("r", total, 16, view.now_s), cached)
    pool = view.instances(None, "prefill")
    floor = rng.choice([0, 1024, 8192])
    out: list[object] = [best_cached(query, pool), _holder(query, pool)]
    if pool:
        p, c = pick_prefill(query, view, pool)
        out.append((p, c))
        q, c2 = place(query, view, pool, floor_tokens=floor)
        out.append((q, c2))
    out.append(pick_decode(view))  # type: ignore[arg-type]
    return out


def _run(seed: int, steps: int, skip_touch_at: int | None = None) -> int:
    """Random state changes; returns how many decisions differed between ranked and scan."""
    rng = random.Random(seed)
    cfg = build_system(load_scenario("paper-case-study"), "prfaas_pd")
    profiles = [cfg.pd_prefill, cfg.prfaas_prefill] if seed % 2 else [cfg.pd_prefill]
    clock = [0.0]
    prefill, decode = PrefillPool(lambda: clock[0]), DecodePool(lambda: clock[0])
    ranked, scan = FakeView(prefill, decode, clock, False), FakeView(prefill, decode, clock, True)
    ps = [PrefillInstance(f"p{i:03d}", PD_CLUSTER, rng.choice(profiles))  # type: ignore[arg-type]
          for i in range(rng.choice([3, 12, 60]))]
    ds = [DecodeInstance(f"d{i:03d}", PD_CLUSTER, cfg.decode) for i in range(rng.choice([2, 9]))]
    for p in ps:
        prefill.add(p)
        ranked.profiles[p.instance_id] = scan.profiles[p.instance_id] = p.profile
    for d in ds:
        decode.add(d)
    services = [0.5, 1.25, 3.0, 0.1 + 0.2]  # repeated values: equal drain times, ties by name
    differ = 0
    for step in range(steps):
        clock[0] += rng.choice([0.0, 0.0, 0.05, 0.3, 1.7])
        p = rng.choice(ps)
        op = rng.random()
        if op < 0.45 and p in prefill:
            p.enqueue(step, rng.choice(services))
            if p.running < 0:
                p.start_next(clock[0])
        elif op < 0.8 and p.running >= 0:
            p.finish()
            p.start_next(clock[0])
        elif op < 0.85:
            if p in prefill and len(prefill) > 1:
                prefill.remove(p)
            elif p not in prefill:
                prefill.add(p)
        d = rng.choice(ds)
        if rng.random() < 0.5:
            d.inflight += 1
        elif d.inflight:
            d.inflight -= 1
            d.join(clock[0], step, rng.choice([3, 50]))
        else:
            d.pop_finished(clock[0] + 60)
        if step != skip_touch_at:
            if p in prefill:
                prefill.touch(p)
            decode.touch(d)
        draws = rng.getstate()
        fast = _decisions(rng, ranked, [x.instance_id for x in ps])
        rng.setstate(draws)
        slow = _decisions(rng, scan, [x.instance_id for x in ps])
        differ += fast != slow
    return differ


@pytest.mark.parametrize("seed", range(8))
def test_ranked_pool_decides_as_a_full_scan(seed: int) -> None:
    assert _run(seed, 400) == 0


def test_a_missed_state_change_is_caught() -> None:
    """Negative control: the same comparison fails when one change is not told to the pool."""
    assert sum(_run(seed, 400, skip_touch_at=k) for seed in range(4) for k in (5, 50, 150)) > 0


def test_pools_cover_both_clusters_in_the_simulator() -> None:
    from prfaas.sim.simulator import Simulator
    from prfaas.workload.arrivals import make_arrivals
    from prfaas.workload.requests import synthetic

    s = load_scenario("paper-case-study")
    sim = Simulator(build_system(s, "prfaas_pd"),
                    synthetic(s.lengths, 64, make_arrivals("uniform"), 2.0, 20, seed=0))
    for cluster in (PRFAAS_CLUSTER, PD_CLUSTER):
        pool = sim.view.instances(cluster, "prefill")
        assert [i.instance_id for i in pool] == [
            p.instance_id for p in sim.prefills if p.cluster == cluster]
