"""The simulator's independent runs as Ray tasks, with results identical to the local run.

A capacity search is a chain of probes, each depending on the verdicts before it, so the probes
themselves are what runs in parallel: `SpeculativeProber` is the `probe_at` of
sim/capacity.py's `find_capacity`. Before waiting for the rate the search asks for, it replays
the search (`search_rates`, no simulation) on every combination of the next `ahead` verdicts
and submits each rate those would ask for as a Ray task. The search still consumes the probes
one by one in its own order, so the probe list and the capacity are exactly the local ones
(every probe is a pure function of config, rate and seed); the parallelism is speculative and
the tasks on the path not taken end with the driver (Ray ends an owner's tasks when it
disconnects; `ray.cancel` of them raced their completion and crashed the driver in 2.60).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import ray

from prfaas.sim.capacity import Probe, run_probe
from prfaas.sim.system import SystemConfig
from prfaas.workload.arrivals import ArrivalProcess
from prfaas.workload.lengths import LengthDistribution

NO_USAGE_STATS = {"RAY_USAGE_STATS_ENABLED": "0"}


class SpeculativeProber:
    def __init__(self, cfg: SystemConfig, lengths: LengthDistribution, output_tokens: int,
                 arrivals: ArrivalProcess, requests: int, seed: int,
                 search: Callable[[], Generator[float, bool, float]], ahead: int = 2,
                 on_submit: Callable[[int], None] | None = None) -> None:
        self._args: list[Any] = [ray.put(a) for a in (cfg, lengths, output_tokens, arrivals)]
        self.requests, self.seed = requests, seed
        self.search, self.ahead = search, ahead
        self.history: list[bool] = []  # the verdicts the search has been sent so far
        self.pending: dict[float, Any] = {}  # rate -> ObjectRef of its Probe
        self.on_submit = on_submit
        self._task: Any = ray.remote(num_cpus=1)(run_probe)

    @property
    def submitted(self) -> int:
        return len(self.pending)

    def __call__(self, rate: float) -> Probe:
        self._submit_tree(self.history, rate, self.ahead)
        probe: Probe = ray.get(self.pending[rate])
        self.history.append(probe.sustainable)
        return probe

    def _next(self, verdicts: list[bool]) -> float | None:
        search = self.search()
        try:
            rate = next(search)
            for verdict in verdicts:
                rate = search.send(verdict)
        except StopIteration:
            return None
        return rate

    def _submit_tree(self, history: list[bool], rate: float | None, depth: int) -> None:
        if rate is None:
            return
        if rate not in self.pending:
            self.pending[rate] = self._task.remote(*self._args, rate, self.requests, self.seed)
            if self.on_submit is not None:
                self.on_submit(len(self.pending))
        if depth > 0:
            for verdict in (True, False):
                assumed = [*history, verdict]
                self._submit_tree(assumed, self._next(assumed), depth - 1)


def connect(address: str) -> None:
    """Connect this process to the Ray cluster at `address` as a driver (no usage stats)."""
    import logging
    import os

    for key, value in NO_USAGE_STATS.items():
        os.environ.setdefault(key, value)
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)


def disconnect() -> None:
    ray.shutdown()
