"""What a sim-vs-live run measures: requests per load, the loads, the workload's shape, and the
rules its verdict applies (the request-count floor, the loaded point, the field's targets)."""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.errors import ConfigError

# the verdict's request-count floor per load: fewer and the bootstrap interval says little
MIN_REQUESTS = 48
# a load at or above this share of the planner's capacity is "loaded": queueing dominates there,
# and a run without one cannot say the simulator predicts a deployment under load
LOADED_SHARE = 0.75
# the field's usual targets (docs/sim-vs-live.md), reported beside the verdict, not instead of it
GOAL = {"ttft_mape_max": 0.15, "throughput_rel_err_max": 0.05, "route_agreement_min": 0.95}
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Options:
    requests: int  # per load
    load_fractions: tuple[float, ...]  # of the planner's capacity at the topology's t
    seed: int = 2026
    median_tokens: int = 1000
    sigma: float = 0.7
    min_tokens: int = 64
    max_tokens: int = 3500  # clipped to the model's context minus the longest output
    output_range: tuple[int, int] = (16, 32)
    # unmeasured requests through the fresh deployment before the first load
    # (idle_routes.warm_up)
    warmup_requests: int = 8
    # the idle points: measured on the loads' own deployment just before the first load
    # (True), or read from the profile (False: its `idle_ttft`, if any)
    idle_points_on_deployment: bool = True
    # a load's time: its arrivals' span plus this much of it again (at least MIN_DRAIN_S) for
    # the last requests to finish; a load not done by then stops the run (live.LoadIncomplete)
    drain_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.requests < 4:
            raise ConfigError("requests", self.requests, "must be >= 4")
        if self.warmup_requests < 0:
            raise ConfigError("warmup_requests", self.warmup_requests, "must be >= 0")
        if len(self.load_fractions) < 2 or min(self.load_fractions) <= 0:
            raise ConfigError("load_fractions", self.load_fractions,
                              "need at least two positive loads")
        if not self.drain_factor > 0:
            raise ConfigError("drain_factor", self.drain_factor, "must be positive")


MIN_DRAIN_S = 60.0

QUICK = Options(requests=MIN_REQUESTS, load_fractions=(0.25, LOADED_SHARE))
FULL = Options(requests=2 * MIN_REQUESTS, load_fractions=(0.25, 0.5, LOADED_SHARE))


def time_limit_s(span_s: float, options: Options) -> float:
    """How long a load whose arrivals span `span_s` may take, from its first arrival."""
    return span_s + max(MIN_DRAIN_S, options.drain_factor * span_s)
