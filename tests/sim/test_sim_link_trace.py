"""LinkTrace reads the simulated link's byte counter over time: the counter's total must
equal the KV of the requests that crossed the link (the request log, a separate record), its
samples never decrease, and during a 10x dip the link carries at most the dip's capacity."""

from __future__ import annotations

import numpy as np
import pytest

from prfaas.core.errors import ConfigError
from prfaas.scenario import load_scenario
from prfaas.sim.link import BYTES_PER_GBPS, LinkSchedule
from prfaas.sim.link_trace import LinkTrace
from prfaas.sim.policy_run import run_policy
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic


def test_trace_carries_the_remote_kv_and_respects_the_dip() -> None:
    s = load_scenario("link-fluctuation")
    w = synthetic(s.lengths, s.output_tokens, make_arrivals("poisson"), 2.8, 600, seed=0)
    gbps = s.link_gbps
    schedule = LinkSchedule.piecewise([(0.0, gbps), (60.0, gbps / 10), (140.0, gbps)])
    trace = LinkTrace(1.0)
    sim, _ = run_policy(s, "prfaas_pd", "prfaas-threshold", w, n_p=4, n_d=4, link=schedule,
                        plugins=[trace])
    t, carried = np.array(trace.samples).T
    assert np.all(np.diff(t) > 0) and np.all(np.diff(carried) >= -1e-6)
    remote_kv = float(np.asarray(sim.log.kv_bytes)[np.asarray(sim.log.remote)].sum())
    assert remote_kv > 0
    # the link's counter integrates rates; the log sums sizes: equal within float rounding
    assert carried[-1] == pytest.approx(remote_kv, rel=1e-9)
    in_dip = (t >= 61.0) & (t <= 140.0)
    rate_bps = np.diff(carried[in_dip]) / np.diff(t[in_dip])
    assert 0 < rate_bps.max() <= gbps / 10 * BYTES_PER_GBPS * (1 + 1e-9)
    # negative control: before the dip the link ran faster than the dip's capacity allows
    before = t <= 60.0
    fast = np.diff(carried[before]) / np.diff(t[before])
    assert fast.max() > gbps / 10 * BYTES_PER_GBPS


def test_trace_period_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="period_s"):
        LinkTrace(0.0)
