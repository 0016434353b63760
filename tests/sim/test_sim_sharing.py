"""Prefill instances on shared cores (sim/sharing.py): processor sharing against hand-computed
times, with the unshared system as the negative control."""

from __future__ import annotations

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.models.profile import PrefillTime
from prfaas.scenario import Scenario
from prfaas.sim.instances import PrefillInstance
from prfaas.sim.outages import Outage
from prfaas.sim.run import simulate
from prfaas.sim.sharing import CoreGroup, slowdown
from prfaas.sim.system import SystemConfig, build_system
from prfaas.workload.requests import Workload

PAIR = (("prfaas-p0000", "pd-p0000"),)


def _inst(name: str) -> PrefillInstance:
    return PrefillInstance(name, "c", PrefillTime(0.0, 0.0, 1.0))


def _system(scenario: Scenario, **overrides: object) -> SystemConfig:
    # one PrfaaS and one PD-P instance; prompts over 10K tokens go to PrfaaS
    return build_system(scenario, "prfaas_pd", threshold_tokens=10000, n_p=1, n_prfaas=1,
                        **overrides)


def _two(long_tokens: int, short_tokens: int, gap_s: float = 0.0) -> Workload:
    return Workload(np.array([0.0, gap_s]), np.array([long_tokens, short_tokens]),
                    np.array([8, 8]), "two")


def test_slowdown_law() -> None:
    assert [slowdown(k, 2.0) for k in (1, 2, 3)] == [1.0, 2.0, 3.0]  # processor sharing
    assert slowdown(2, 1.5) == 1.5 and slowdown(3, 1.5) == 2.0 and slowdown(1, 1.5) == 1.0


def test_core_group_moves_running_prefills() -> None:
    a, b, c = _inst("a"), _inst("b"), _inst("c")
    group = CoreGroup(2.0)
    for inst in (a, b, c):
        inst.share = group
    a.enqueue(0, 1.0)
    a.start_next(0.0)
    assert group.start(a, 1.0, 0.0) == [a] and a.busy_until_s == 1.0  # alone: its T(l)
    b.enqueue(1, 1.0)
    b.start_next(0.5)
    group.start(b, 1.0, 0.5)
    # a did 0.5 s alone, its other 0.5 s takes 1 s at half speed; b's end as if both ran on
    assert a.busy_until_s == pytest.approx(1.5) and b.busy_until_s == pytest.approx(2.5)
    assert a.load(0.5).queued_work_s == pytest.approx(1.0)  # what the router sees: the shared ETA
    v = a.version
    a.finish()
    assert group.finish(a, 1.5) == [b] and b.busy_until_s == pytest.approx(2.0)  # alone now
    assert a.version == v  # (finishing voids nothing of a's)
    c.enqueue(2, 0.25)
    c.start_next(1.5)
    group.start(c, 0.25, 1.5)  # b has 0.5 s left, c 0.25 s: both at half speed
    assert c.busy_until_s == pytest.approx(2.0) and b.busy_until_s == pytest.approx(2.5)
    c.finish()
    assert group.finish(c, 2.0) == [b] and b.busy_until_s == pytest.approx(2.25)
    assert b.busy_s == pytest.approx(2.25 - 0.5)  # busy time is the shared wall time


@pytest.mark.parametrize("factor", [2.0, 1.5])
def test_two_overlapping_prefills_on_one_core(scenario: Scenario, factor: float) -> None:
    wl = _two(32768, 4096)
    alone, _ = simulate(_system(scenario), wl)
    shared, _ = simulate(_system(scenario, core_groups=PAIR, core_share_factor=factor), wl)
    assert list(alone.log.remote) == list(shared.log.remote) == [True, False]
    long_s = scenario.prfaas.hardware.require_prefill().seconds(32768)
    short_s = scenario.pd.hardware.require_prefill().seconds(4096)
    # negative control: on separate cores each takes its profile's time
    assert alone.log.prefill_end_s == pytest.approx([long_s, short_s], rel=1e-9)
    # shared: both at 1/factor until the short one is done, then the long one alone
    end_short = short_s * factor
    assert shared.log.prefill_end_s == pytest.approx(
        [end_short + (long_s - short_s), end_short], rel=1e-9)
    assert shared.log.kv_ready_s[1] > alone.log.kv_ready_s[1]


def test_prefills_that_do_not_overlap_are_not_slowed(scenario: Scenario) -> None:
    long_s = scenario.prfaas.hardware.require_prefill().seconds(32768)
    wl = _two(32768, 4096, gap_s=long_s + 1.0)
    alone, _ = simulate(_system(scenario), wl)
    shared, _ = simulate(_system(scenario, core_groups=PAIR), wl)
    assert shared.log.prefill_end_s == pytest.approx(alone.log.prefill_end_s, rel=1e-12)
    assert shared.log.kv_ready_s == pytest.approx(alone.log.kv_ready_s, rel=1e-12)


def test_an_unshared_system_is_unchanged(scenario: Scenario) -> None:
    rng = np.random.default_rng(3)
    n = 200
    wl = Workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(1000, 40000, n),
                  np.full(n, 64), "mixed")
    base, _ = simulate(_system(scenario), wl)
    # a group of one instance has nothing to share with: bit-identical
    one, _ = simulate(_system(scenario, core_groups=(("pd-p0000",),)), wl)
    assert one.log.kv_ready_s == base.log.kv_ready_s
    assert one.log.finish_s == base.log.finish_s
    both, _ = simulate(_system(scenario, core_groups=PAIR), wl)
    assert both.log.kv_ready_s != base.log.kv_ready_s  # and the pair does change them


def test_bad_groups_are_refused(scenario: Scenario) -> None:
    with pytest.raises(ConfigError, match="core_groups"):
        simulate(_system(scenario, core_groups=(("pd-p0007",),)), _two(32768, 4096))
    with pytest.raises(ConfigError, match="core_groups"):
        _system(scenario, core_groups=(("pd-p0000",), ("pd-p0000", "prfaas-p0000")))
    with pytest.raises(ConfigError, match="core_share_factor"):
        _system(scenario, core_groups=PAIR, core_share_factor=0.5)


def test_a_member_that_goes_down_frees_the_core_at_once(scenario: Scenario) -> None:
    """The PrfaaS instance goes down while both prefills run: from then on the PD-P prefill
    runs alone (work done at half speed until then, the rest at full speed). Checked to fail
    when failover aborts the instance without telling its group (the earlier code: the PD-P
    prefill stayed at half speed, 2 x T(l), until another event; with the group's lazy
    clean-up removed, a corrupted retime)."""
    short_s = scenario.pd.hardware.require_prefill().seconds(4096)
    down_s = short_s / 2
    wl = _two(32768, 4096)
    sim, _ = simulate(_system(scenario, core_groups=PAIR), wl,
                      outages=[Outage("prfaas", down_s, 1000.0)])
    freed = down_s + (short_s - down_s / 2.0)
    assert sim.log.prefill_end_s[1] == pytest.approx(freed, rel=1e-9)
