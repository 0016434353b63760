"""The comparison, pure: two worlds' per-request outcomes in, one load's figures and the run's
verdict out (unit-tested with negative controls).

Per load, over the requests both worlds completed:
- `ttft_mape`: mean of |sim - live| / live; `ttft_mape_ci90`: the 5th and 95th percentiles of
  that mean over `BOOTSTRAP_RESAMPLES` resamples of the requests (seeded);
- `baseline_ttft_mape`: the same for the no-simulator baseline (baseline.py);
- `ttft_p50_err`, `ttft_p90_err`: (sim - live) / live of the two worlds' TTFT percentiles, and
  `e2e_mean_err` of their mean end-to-end latency, `e2e_mape` per request (as BLIS and
  LLMServingSim report them);
- `throughput_*_rps`: completed requests / (last finish - first arrival), each side on its own
  times; `route_agreement`: the share of requests both sent the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.experiments.sim_vs_live.options import (
    BOOTSTRAP_RESAMPLES,
    GOAL,
    LOADED_SHARE,
    MIN_REQUESTS,
)


@dataclass(frozen=True)
class Side:
    """Per-request outcome of one world, in request order (seconds from the run's start)."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray  # nan where the request failed
    finish_s: np.ndarray  # nan where the request failed
    remote: np.ndarray  # bool: sent to the PrfaaS cluster by the policy

    @property
    def ok(self) -> np.ndarray:
        return np.isfinite(self.ttft_s) & np.isfinite(self.finish_s)

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s


def _both(live: np.ndarray, sim: np.ndarray) -> np.ndarray:
    return np.isfinite(live) & np.isfinite(sim) & (live > 0)


def mape(live: np.ndarray, sim: np.ndarray) -> float | None:
    ok = _both(live, sim)
    if not ok.any():
        return None
    return float(np.mean(np.abs(sim[ok] - live[ok]) / live[ok]))


def ttft_mape(live: Side, sim: Side) -> float | None:
    return mape(live.ttft_s, sim.ttft_s)


def mape_ci90(live: np.ndarray, sim: np.ndarray, seed: int,
              resamples: int = BOOTSTRAP_RESAMPLES) -> list[float] | None:
    """A bootstrap 90% interval of the MAPE: the requests resampled with replacement."""
    ok = _both(live, sim)
    if not ok.any():
        return None
    err = np.abs(sim[ok] - live[ok]) / live[ok]
    rng = np.random.default_rng(seed)
    means = err[rng.integers(0, err.size, (resamples, err.size))].mean(axis=1)
    return [float(np.percentile(means, 5)), float(np.percentile(means, 95))]


def percentile_err(live: np.ndarray, sim: np.ndarray, q: float) -> float | None:
    """(sim - live) / live of the q-th percentile of each world, over requests both completed."""
    ok = _both(live, sim)
    if not ok.any():
        return None
    lp = float(np.percentile(live[ok], q))
    return (float(np.percentile(sim[ok], q)) - lp) / lp


def mean_err(live: np.ndarray, sim: np.ndarray) -> float | None:
    ok = _both(live, sim)
    if not ok.any():
        return None
    return float((sim[ok].mean() - live[ok].mean()) / live[ok].mean())


def throughput_rps(side: Side) -> float:
    ok = side.ok
    if not ok.any():
        return 0.0
    span = float(side.finish_s[ok].max() - side.arrival_s.min())
    return float(ok.sum()) / span if span > 0 else 0.0


def route_agreement(live: Side, sim: Side) -> float:
    if live.remote.size != sim.remote.size or live.remote.size == 0:
        raise ConfigError("route_agreement", (live.remote.size, sim.remote.size),
                          "the two sides must hold the same non-empty workload")
    return float(np.mean(live.remote == sim.remote))


def _pcts(values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    return {} if v.size == 0 else {"p50": round(float(np.percentile(v, 50)), 4),
                                   "p90": round(float(np.percentile(v, 90)), 4),
                                   "mean": round(float(v.mean()), 4)}


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def load_entry(offered_rps: float, share: float, live: Side, sim: Side,
               baseline_ttft_s: np.ndarray, seed: int) -> dict[str, Any]:
    """One load's figures (module docstring); `share`: its fraction of the planner's capacity;
    `baseline_ttft_s`: the no-simulator baseline's TTFT per request (nan: it has none)."""
    by_route: dict[str, float | None] = {}
    base_by_route: dict[str, float | None] = {}
    for route, keep in (("prfaas", live.remote), ("pd", ~live.remote)):
        by_route[route] = _r(mape(live.ttft_s[keep], sim.ttft_s[keep]))
        base_by_route[route] = _r(mape(live.ttft_s[keep], baseline_ttft_s[keep]))
    both = _both(live.ttft_s, sim.ttft_s)
    bias = (float(np.mean((sim.ttft_s[both] - live.ttft_s[both]) / live.ttft_s[both]))
            if both.any() else None)
    ci = mape_ci90(live.ttft_s, sim.ttft_s, seed)
    thr_live, thr_sim = throughput_rps(live), throughput_rps(sim)
    return {
        "offered_rps": round(offered_rps, 5), "share_of_capacity": round(share, 4),
        "requests": int(live.arrival_s.size), "compared": int(both.sum()),
        "ttft_mape": _r(ttft_mape(live, sim)),
        "ttft_mape_ci90": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
        "baseline_ttft_mape": _r(mape(live.ttft_s, baseline_ttft_s)),
        "ttft_p50_err": _r(percentile_err(live.ttft_s, sim.ttft_s, 50)),
        "ttft_p90_err": _r(percentile_err(live.ttft_s, sim.ttft_s, 90)),
        "e2e_mean_err": _r(mean_err(live.e2e_s, sim.e2e_s)),
        "e2e_mape": _r(mape(live.e2e_s, sim.e2e_s)),
        "throughput_live_rps": round(thr_live, 5), "throughput_sim_rps": round(thr_sim, 5),
        "throughput_rel_err": round(abs(thr_sim - thr_live) / thr_live, 4) if thr_live else None,
        "route_agreement": round(route_agreement(live, sim), 4),
        "ttft_bias": _r(bias),
        "ttft_mape_by_live_route": by_route,
        "baseline_ttft_mape_by_live_route": base_by_route,
        "completed_live": int(live.ok.sum()), "completed_sim": int(sim.ok.sum()),
        "offload_live": round(float(live.remote.mean()), 4),
        "offload_sim": round(float(sim.remote.mean()), 4),
        "ttft_live_s": _pcts(live.ttft_s), "ttft_sim_s": _pcts(sim.ttft_s),
        "e2e_live_s": _pcts(live.e2e_s), "e2e_sim_s": _pcts(sim.e2e_s),
    }


def load_verdict(load: dict[str, Any]) -> dict[str, Any]:
    """Does the simulator predict this load? Only on at least MIN_REQUESTS compared requests,
    and only where its MAPE's interval lies wholly below the baseline's MAPE."""
    n, ci, base = load["compared"], load["ttft_mape_ci90"], load["baseline_ttft_mape"]
    if n < MIN_REQUESTS:
        return {"predicts": False,
                "why": f"{n} requests compared, fewer than the {MIN_REQUESTS} a verdict needs"}
    if ci is None or base is None:
        return {"predicts": False, "why": "no baseline (no idle point on a route it needs)"
                if base is None else "no request completed on both sides"}
    if ci[1] < base:
        return {"predicts": True, "why": f"MAPE {load['ttft_mape']:.1%} "
                f"[{ci[0]:.1%}, {ci[1]:.1%}] is below the baseline's {base:.1%}"}
    return {"predicts": False, "why": f"MAPE {load['ttft_mape']:.1%} [{ci[0]:.1%}, {ci[1]:.1%}]"
            f" does not beat the baseline's {base:.1%} beyond its interval"}


def verdict(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's verdict: the simulator predicts the deployment when it predicts every load
    and one of the loads is at least LOADED_SHARE of the planner's capacity."""
    per = [load_verdict(x) for x in loads]
    loaded = any(x["share_of_capacity"] >= LOADED_SHARE - 1e-9 for x in loads)
    good = sum(v["predicts"] for v in per)
    predicts = good == len(loads) and loaded
    line = (f"the simulator predicts TTFT at {good} of {len(loads)} loads"
            + ("" if loaded else f" (no load at {LOADED_SHARE:.0%} of capacity or more)"))
    return {"predicts": predicts, "line": line,
            "loads": [{"offered_rps": x["offered_rps"],
                       "share_of_capacity": x["share_of_capacity"], **v}
                      for x, v in zip(loads, per, strict=True)]}


def meets_goal(loads: list[dict[str, Any]]) -> dict[str, bool]:
    """The field's targets (GOAL), every load, on at least MIN_REQUESTS requests each."""
    def every(pred: Callable[[dict[str, Any]], bool]) -> bool:
        return all(pred(x) for x in loads)

    return {"requests": every(lambda x: x["compared"] >= MIN_REQUESTS),
            "ttft_mape": every(lambda x: x["ttft_mape"] is not None
                               and x["ttft_mape"] <= GOAL["ttft_mape_max"]),
            "throughput": every(lambda x: x["throughput_rel_err"] is not None
                                and x["throughput_rel_err"] <= GOAL["throughput_rel_err_max"]),
            "route_agreement": every(lambda x: x["route_agreement"]
                                     >= GOAL["route_agreement_min"])}
