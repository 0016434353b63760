"""Scheduled outages: `--outage NAME@START+DURATION`, applied through `Failover`.

NAME is an instance id (`prfaas-p0000`, `pd-p0001`, `pd-d0002`), a group (`prfaas`: every PrfaaS
prefill instance; `pd-p`, `pd-d`: the PD cluster's prefill or decode instances; `pd`: both) or
`link` (the inter-cluster link). START and DURATION are seconds of simulated time. During the
outage the instances vanish from the `ClusterView` (or the link reports `up=False`) and the same
policy objects route around them; what was in flight is re-run on the local path
(sim/failover.py). Several outages may be given, overlapping or not.

The summary gets `outages`: per outage its instances and three windows of equal length,
`before` [start - D, start), `during` [start, start + D) and `after` [start + D, start + 2D):
requests arrived, TTFT (mean, P50, P99) of those arrivals, completions / window length
(`throughput_rps`), the share of arrivals prefilled locally, re-runs and lost requests; plus
`lost` and `rerun_requests` for the whole run. Deterministic: same seed, same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, PRFAAS_CLUSTER
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.plugin import SimPlugin
from prfaas.sim.simulator import Simulator

LINK = "link"
GROUPS = ("prfaas", "pd", "pd-p", "pd-d", LINK)


@dataclass(frozen=True, slots=True)
class Outage:
    target: str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def as_text(self) -> str:
        return f"{self.target}@{self.start_s:g}+{self.duration_s:g}"


def parse_outage(text: str) -> Outage:
    """'prfaas@600+120' -> Outage('prfaas', 600.0, 120.0); malformed input: ConfigError."""
    name, at, times = str(text).partition("@")
    start, plus, duration = times.partition("+")
    if not (name and at and plus):
        raise ConfigError("outage", text, "expected NAME@START+DURATION (seconds), e.g. "
                          "prfaas@600+120")
    try:
        start_s, duration_s = float(start), float(duration)
    except ValueError:
        raise ConfigError("outage", text, "START and DURATION must be numbers of seconds") \
            from None
    if not (np.isfinite(start_s) and start_s >= 0):
        raise ConfigError("outage", text, "START must be >= 0 seconds")
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise ConfigError("outage", text, "DURATION must be positive seconds")
    return Outage(name, start_s, duration_s)


def resolve(sim: Simulator, target: str) -> list[PrefillInstance | DecodeInstance]:
    """The instances an outage target names (empty for the link); unknown: ConfigError."""
    groups: dict[str, list[PrefillInstance | DecodeInstance]] = {
        "prfaas": [p for p in sim.prefills if p.cluster == PRFAAS_CLUSTER],
        "pd-p": [p for p in sim.prefills if p.cluster == PD_CLUSTER],
        "pd-d": list(sim.decoders)}
    groups["pd"] = groups["pd-p"] + groups["pd-d"]
    if target == LINK:
        return []
    if groups.get(target):
        return groups[target]
    inst: PrefillInstance | DecodeInstance | None = sim.prefill_by_id.get(target)
    if inst is None:  # (not `or`: an idle PrefillInstance has len 0)
        inst = sim.decode_by_id.get(target)
    if inst is None:
        names = [g for g in GROUPS if g == LINK or groups.get(g)]
        raise ConfigError("outage", target, f"names no instance; use {', '.join(names)} or an "
                          f"instance id such as {sim.prefills[0].instance_id}")
    return [inst]


class OutagePlugin(SimPlugin):
    def __init__(self, outages: list[Outage]) -> None:
        self.outages = list(outages)
        self._sim: Simulator | None = None
        self._members: list[list[PrefillInstance | DecodeInstance]] = []

    def attach(self, sim: Simulator) -> None:
        self._sim = sim
        self._members = [resolve(sim, o.target) for o in self.outages]
        for outage, members in zip(self.outages, self._members, strict=True):
            sim.call_at(outage.start_s, partial(self._down, outage, members), True)
            sim.call_at(outage.end_s, partial(self._up, outage, members), True)

    def _down(self, outage: Outage, members: list[PrefillInstance | DecodeInstance]) -> None:
        assert self._sim is not None
        failover = self._sim.failover
        if outage.target == LINK:
            failover.link_down()
        for inst in members:
            failover.instance_down(inst)

    def _up(self, outage: Outage, members: list[PrefillInstance | DecodeInstance]) -> None:
        assert self._sim is not None
        failover = self._sim.failover
        if outage.target == LINK:
            failover.link_up()
        for inst in members:
            failover.instance_up(inst)

    def summary(self) -> dict[str, Any]:
        sim = self._sim
        assert sim is not None
        failover = sim.failover
        out = []
        for outage, members in zip(self.outages, self._members, strict=True):
            d = outage.duration_s
            bounds = {"before": (max(outage.start_s - d, 0.0), outage.start_s),
                      "during": (outage.start_s, outage.end_s),
                      "after": (outage.end_s, outage.end_s + d)}
            out.append({"outage": outage.as_text(), "target": outage.target,
                        "instances": [i.instance_id for i in members],
                        "windows": {k: window(sim, lo, hi) for k, (lo, hi) in bounds.items()}})
        return {"outages": out, "lost": len(failover.lost),
                "rerun_requests": len(failover.reruns)}


def window(sim: Simulator, lo_s: float, hi_s: float) -> dict[str, Any]:
    """Figures of the requests that arrived in [lo_s, hi_s) and of completions in it (an empty
    window, an outage at 0 s having no `before`, gives zero counts and null figures)."""
    log, failover = sim.log, sim.failover
    arrival = np.asarray(log.arrival_s)
    finish = np.asarray(log.finish_s)
    sel = np.flatnonzero((arrival >= lo_s) & (arrival < hi_s))
    ttft = (np.asarray(log.kv_ready_s) - arrival)[sel]
    ttft = ttft[np.isfinite(ttft)]
    accepted = [i for i in sel.tolist() if not log.rejected[i]]
    done = int(((finish >= lo_s) & (finish < hi_s)).sum())

    def stat(q: float | None) -> float | None:
        if not ttft.size:
            return None
        return round(float(ttft.mean() if q is None else np.percentile(ttft, q)), 6)

    return {"start_s": round(lo_s, 3), "end_s": round(hi_s, 3), "arrived": int(sel.size),
            "rejected": int(sel.size - len(accepted)),
            "ttft_s": {"mean": stat(None), "p50": stat(50), "p99": stat(99)},
            "throughput_rps": round(done / (hi_s - lo_s), 6) if hi_s > lo_s else None,
            "local_share": round(sum(not log.remote[i] for i in accepted) / len(accepted), 6)
            if accepted else None,
            "reruns": sum(1 for i in sel.tolist() if failover.reruns[i]),
            "lost": sum(1 for i in sel.tolist() if i in failover.lost)}
