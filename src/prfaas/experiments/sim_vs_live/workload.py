"""The requests both worlds serve: one draw of Poisson gaps, prompt and output lengths, its time
axis rescaled per load (common random numbers); the warm-up's lengths; and a committed run's
workloads rebuilt from its JSON."""

from __future__ import annotations

from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.experiments.sim_vs_live.options import Options
from prfaas.experiments.sim_vs_live.scenario import max_input_tokens
from prfaas.workload.lengths import LengthDistribution, truncated_lognormal
from prfaas.workload.requests import Workload


def lengths_for(options: Options, max_context_tokens: int) -> LengthDistribution:
    return truncated_lognormal(float(np.log(options.median_tokens)), options.sigma,
                               options.min_tokens, max_input_tokens(options, max_context_tokens))


def workloads(options: Options, lengths: LengthDistribution, capacity_rps: float
              ) -> list[Workload]:
    """Common random numbers: one draw of gaps and lengths, its time axis rescaled per load."""
    rng = np.random.default_rng(options.seed)
    n = options.requests
    gaps = rng.exponential(1.0, n)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    inputs = lengths.sample(rng, n)
    outputs = rng.integers(options.output_range[0], options.output_range[1] + 1, n)
    return [Workload(arrival / (f * capacity_rps), inputs, outputs,
                     f"poisson {f * capacity_rps:.4f} req/s, {lengths.name}")
            for f in options.load_fractions]


def options_of(result: dict[str, Any]) -> Options:
    """A committed run's options, from its `sim_vs_live.json`."""
    o = result["options"]
    return Options(**{**o, "load_fractions": tuple(o["load_fractions"]),
                      "output_range": tuple(o["output_range"])})


def replay_workloads(result: dict[str, Any], max_context_tokens: int
                     ) -> tuple[Options, list[Workload]]:
    """A committed run's options and workloads rebuilt from its `sim_vs_live.json` (the same
    seed, lengths and arrivals), for re-simulating it with another model; each workload is
    checked against the run's own per-request input lengths."""
    options = options_of(result)
    loads = workloads(options, lengths_for(options, max_context_tokens),
                      result["planner_capacity_rps"])
    for w, entry in zip(loads, result["loads"], strict=True):
        if [int(x) for x in w.input_tokens] != entry["per_request"]["input_tokens"]:
            raise ConfigError("sim_vs_live.json", entry["offered_rps"],
                              "the rebuilt workload's lengths are not the run's")
    return options, loads


WARMUP_HOW = ("before the first load, one request at a time (each after the previous one "
              "finished, then a pause) through the router: lengths at the length "
              "distribution's evenly spaced quantiles (so both routes), fresh random token-id "
              "prompts, the shortest output; not part of any figure")


def warmup_lengths(lengths: LengthDistribution, n: int) -> list[int]:
    """n prompt lengths at the distribution's quantiles k/(n+1): spread over its range, so the
    threshold policy sends some each way (each prefill instance, each KV link)."""
    return [lengths.quantile((k + 1) / (n + 1)) for k in range(n)]
