"""The profiler's prefill timing on a host that slows down part-way through: the lengths are
interleaved over rounds, so a slow spell costs every length one round (dropped by the median)
instead of every rep of the lengths timed during it. Why it matters: sim-vs-live's idle route
overhead reads profile error as a fixed cost (docs/sim-vs-live.md); timed length after length,
a slow spell at the end made the profile's longest lengths, the PrfaaS route's, slow together.
A scripted clock and engine: no real timing, nothing that can race."""

from __future__ import annotations

from dataclasses import dataclass, field

from prfaas.engine.profiler import measure_prefill

SECONDS_PER_TOKEN = 1e-3
LENGTHS = (100, 200, 400)


@dataclass
class _KV:
    n: int

    def byte_size(self) -> int:
        return 10 * self.n


@dataclass
class _Result:
    kv: _KV


@dataclass
class SlowingHost:
    """A linear-cost engine on a scripted clock: prefills number `slow_from` and later take
    `factor` times as long (a neighbour's burst at the end of the measurement)."""

    slow_from: int
    factor: float = 2.0
    now_s: float = 0.0
    calls: int = 0
    lengths: list[int] = field(default_factory=list)

    def clock(self) -> float:
        return self.now_s

    def prefill(self, token_ids: list[int]) -> _Result:
        slow = self.factor if self.calls >= self.slow_from else 1.0
        self.now_s += len(token_ids) * SECONDS_PER_TOKEN * slow
        self.calls += 1
        self.lengths.append(len(token_ids))
        return _Result(_KV(len(token_ids)))


def _per_token(times: list[tuple[int, float]]) -> dict[int, float]:
    """Seconds per token by length, to 1e-9 (differences of a float clock: ulp-level noise)."""
    return {n: round(t / n, 9) for n, t in times}


def test_a_slow_last_round_biases_no_length() -> None:
    reps = 3
    host = SlowingHost(slow_from=1 + len(LENGTHS) * (reps - 1))  # warm-up, then the last round
    times, sizes = measure_prefill(host, LENGTHS, reps, clock=host.clock)  # type: ignore[arg-type]
    assert host.lengths == [100, *LENGTHS * reps]  # warm-up at the shortest, then rounds
    assert _per_token(times) == {n: SECONDS_PER_TOKEN for n in LENGTHS}
    assert sizes == [(n, 10 * n) for n in LENGTHS]


def test_negative_control_length_after_length_puts_the_spell_on_the_longest() -> None:
    """The same host, timed the old way (every rep of one length, then the next): the check
    above would see the longest length twice as slow per token."""
    reps = 3
    host = SlowingHost(slow_from=len(LENGTHS) * (1 + reps) - reps)  # the last `reps` calls
    times = [measure_prefill(host, (n,), reps, clock=host.clock)[0][0]  # type: ignore[arg-type]
             for n in LENGTHS]
    per_token = _per_token(times)
    assert per_token[400] == 2 * SECONDS_PER_TOKEN
    assert per_token != {n: SECONDS_PER_TOKEN for n in LENGTHS}


def test_a_slow_spell_over_most_rounds_is_measured_not_hidden() -> None:
    """The median drops one slow round in three, not a host that is slow throughout most of
    the measurement: then every length is slow alike (no length-dependent bias)."""
    host = SlowingHost(slow_from=1 + len(LENGTHS))  # rounds 2 and 3 of 3
    times, _ = measure_prefill(host, LENGTHS, 3, clock=host.clock)  # type: ignore[arg-type]
    assert _per_token(times) == {n: 2 * SECONDS_PER_TOKEN for n in LENGTHS}
