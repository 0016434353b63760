"""The capacity search both sides run (experiments/probe.py): it must bracket a capacity from its
own probes alone, never from an answer it is handed. `audit` is the check; a search that only
probes near a given answer (the old live search) must fail it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from prfaas.experiments.probe import Bracket, Confirm, ProbeResult, Search, judge

START_RPS = 1.0
CAPACITIES = (0.3, 1.7, 2.45, 9.4, 55.0)
HINT_ERRORS = (1.0, 1.3, 0.7)  # an answer handed to the search: exact, 30% high, 30% low

SearchFn = Callable[[Callable[[float], ProbeResult], float], Bracket]


def verdict(rate: float, ok: bool) -> ProbeResult:
    return ProbeResult(rate, ok, rate if ok else 0.0, 0.0, 0.0, 1, 1, {}, {})


def honest(probe: Callable[[float], ProbeResult], hint: float) -> Bracket:
    del hint  # the search is never given an answer
    return Search(probe, START_RPS, rel_tol=0.02, max_probes=40).run()


def near_answer(probe: Callable[[float], ProbeResult], hint: float) -> Bracket:
    """The old live search: the answer, the answer / 1.06, their midpoint."""
    lo = hi = None
    for rate in (hint, hint / 1.06, (hint + hint / 1.06) / 2):
        if probe(rate).sustainable:
            lo = max(lo or 0.0, rate)
        else:
            hi = min(hi or float("inf"), rate)
    return Bracket(lo, hi, lo is not None and hi is not None and hi - lo <= 0.02 * lo)


def audit(search: SearchFn) -> list[str]:
    """Problems of `search` against judges whose capacity is known: the bracket must hold the
    capacity, be at most 2% wide, start below it from a rate that depends on nothing, and the
    probes must not change with the answer the caller holds."""
    problems = []
    for capacity in CAPACITIES:
        sequences = set()
        for err in HINT_ERRORS:
            rates: list[float] = []

            def probe(rate: float, rates: list[float] = rates, cap: float = capacity
                      ) -> ProbeResult:
                rates.append(rate)
                return verdict(rate, rate <= cap)

            b = search(probe, capacity * err)
            where = f"capacity {capacity}, hint x{err}"
            lo, hi = b.sustained_rps, b.unsustained_rps
            if lo is None or hi is None or not lo <= capacity < hi:
                problems.append(f"{where}: bracket [{lo}, {hi}] misses the capacity")
            elif (hi - lo) / lo > 0.02:
                problems.append(f"{where}: bracket [{lo}, {hi}] wider than 2%")
            if (lo is not None and lo not in rates) or (hi is not None and hi not in rates):
                problems.append(f"{where}: a bracket end was never probed")
            if rates[0] != START_RPS:
                problems.append(f"{where}: first probe {rates[0]} is not the fixed start")
            sequences.add(tuple(rates))
        if len(sequences) > 1:
            problems.append(f"capacity {capacity}: the probes depend on the hint")
    return problems


def test_search_brackets_capacity_from_its_own_probes() -> None:
    assert audit(honest) == []


def test_audit_catches_a_search_that_probes_near_the_answer() -> None:
    problems = audit(near_answer)
    assert any("depend on the hint" in p for p in problems)
    assert any("misses the capacity" in p for p in problems)


def test_search_reports_no_bracket_when_probes_run_out() -> None:
    b = Search(lambda r: verdict(r, True), START_RPS, max_probes=5).run()
    assert b == Bracket(16.0, None, False)
    assert b.width is None


def _uniform(rate: float, n: int) -> np.ndarray:
    return np.arange(n) / rate


def test_judge_short_probe_at_low_load_is_sustained_and_overload_is_not() -> None:
    rng = np.random.default_rng(0)
    rate, n = 5.0, 80
    arrival = _uniform(rate, n)
    # heavy-tailed delays but no backlog: a few requests take 40x the median
    ready = arrival + np.where(rng.random(n) < 0.1, 4.0, 0.1)
    assert judge(rate, arrival, ready, ready + 5.0).sustainable
    # a server at 85% of the offered rate: FIFO, service 1 / (0.85 rate) each
    served = np.empty(n)
    t = 0.0
    for i, a in enumerate(arrival):
        t = max(t, a) + 1 / (0.85 * rate)
        served[i] = t
    assert not judge(rate, arrival, served, served + 5.0).sustainable
    # and a request that never finished fails the probe whatever the rates
    finish = ready + 5.0
    finish[7] = np.nan
    assert not judge(rate, arrival, ready, finish).sustainable


def _served(arrival: np.ndarray, rate: float, speed: float) -> np.ndarray:
    """A FIFO server at `speed` x the offered rate: ready times of the arrivals."""
    out, t = np.empty(arrival.size), 0.0
    for i, a in enumerate(arrival):
        t = max(t, a) + 1 / (speed * rate)
        out[i] = t
    return out


def test_margins_count_in_requests_what_decides_the_verdict() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):  # the margins' sign is the verdict, sustained or not
        rate, n = float(rng.uniform(1, 20)), int(rng.integers(20, 400))
        arrival = _uniform(rate, n) + rng.uniform(0, 0.3 / rate, n)
        ready = _served(arrival, rate, float(rng.uniform(0.9, 1.1)))
        finish = ready + 1.0
        if rng.random() < 0.1:
            finish[rng.integers(0, n)] = np.nan
        p = judge(rate, arrival, ready, finish)
        assert p.margin_requests is not None
        assert p.sustainable == (p.margin_requests >= 0), p
    # throughput: a probe whose window holds exactly the requests needed, then one fewer
    rate, n = 10.0, 401
    arrival = _uniform(rate, n)
    ready = arrival + 0.05
    # window [10, 40] s: 300 requests ready in it (arrived 10.0-39.9 s), 294 needed (98%)
    p = judge(rate, arrival, ready, ready + 1)
    assert p.margins["throughput"] == 300 - 294 and p.sustainable
    late = ready.copy()
    late[200:207] = 40.5  # 7 of them ready after the window: 293 in it, one short
    p = judge(rate, arrival, late, late + 1)
    assert p.margins["throughput"] == -1 and not p.sustainable
    # the completion test counts the unfinished requests
    finish = ready + 1
    finish[:3] = np.nan
    assert judge(rate, arrival, ready, finish).margins["completed"] == -3


def _known(capacity: float, rates: list[float]) -> Callable[[float], ProbeResult]:
    def probe(rate: float) -> ProbeResult:
        rates.append(rate)
        return verdict(rate, rate <= capacity)
    return probe


@pytest.mark.parametrize("off", [1.0, 0.6, 0.9, 1.08, 1.5])
def test_confirm_finds_the_capacity_from_a_short_bracket_that_is_off(off: float) -> None:
    capacity = 2.0
    short = (Bracket(1.99, 2.02, True) if off == 1.0
             else Bracket(capacity * off, capacity * off * 1.02, True))
    if off != 1.0:  # the control: the short bracket handed in misses the capacity
        assert not short.sustained_rps <= capacity < short.unsustained_rps  # type: ignore
    rates: list[float] = []
    b = Confirm(_known(capacity, rates), rel_tol=0.02, max_probes=12).run(short)
    assert b.converged and b.sustained_rps is not None and b.unsustained_rps is not None
    assert b.sustained_rps <= capacity < b.unsustained_rps
    assert (b.unsustained_rps - b.sustained_rps) / b.sustained_rps <= 0.02
    assert b.sustained_rps in rates and b.unsustained_rps in rates  # both ends long-judged
    if off == 1.0:
        assert rates == [short.sustained_rps, short.unsustained_rps]  # two long probes


def test_confirm_reports_what_it_could_not_reach() -> None:
    rates: list[float] = []
    b = Confirm(_known(10.0, rates), max_probes=3).run(Bracket(1.0, 1.02, True))
    assert b.unsustained_rps is None and not b.converged and len(rates) == 3
    assert b.sustained_rps == max(rates)
    assert Confirm(_known(1.0, []), max_probes=3).run(Bracket(1.0, None, False)) == \
        Bracket(1.0, None, False)
