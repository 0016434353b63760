"""Simulator of one PrfaaS cluster shared by K PD clusters, each with its own link (issue 22).

A separate, small event loop (the one-cluster `Simulator` is untouched): per PD cluster k a
threshold router whose t comes from its `DestinationThreshold`, a PD-P pool (one FIFO queue
feeding N_p instances), a decode pool (N_d x BS_max slots, FIFO admission, T_decode per step at
BS_max as the planner's Eq. 5) and its own `SharedLink` to the PrfaaS cluster (RTT added to
every KV arrival). The PrfaaS cluster's N instances take jobs from one `SharePolicy`
(policy/fair_share.py: deficit round robin on uncached tokens, or FCFS), skipping destinations
whose `EgressBudget` is full. Transfers are pipelined as in the one-cluster simulator: the flow
joins the link at prefill start; the KV is at the decoder at max(flow end, prefill end) + RTT.
Local KV crosses the intra-cluster fabric in S_kv / intra rate. TTFT = arrival to KV (and first
token) at the decoder. Per destination the run counts the picks at which its budget held it back
while it had jobs queued (`held`, the live gateway's `budget_held`) and keeps its link's
cumulative bytes at every start and finish of a flow (`link_points`: exact, the rate being
constant in between), from which the bytes delivered in any window follow. Heap entries
(time, kind, seq, ...): ties resolve by kind (resources are freed before new work arrives),
then insertion order: a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from prfaas.models.profile import KVSize, PrefillTime
from prfaas.policy.fair_share import SharePolicy, make_share_policy
from prfaas.policy.region_control import (
    DestinationThreshold,
    EgressBudget,
    blocked_destinations,
    max_kv_gbps,
)
from prfaas.sim.link import BYTES_PER_GBPS, LinkSchedule, SharedLink
from prfaas.workload.requests import Workload

DECODE_DONE, LINK_DONE, KV_ARRIVE, PREFILL_DONE, ARRIVAL = range(5)
PRFAAS, LOCAL = 0, 1


@dataclass(frozen=True)
class RegionSetup:
    """One PD cluster as simulated (from the plan: regions_run.build_regions)."""

    name: str
    threshold_tokens: int
    max_tokens: int
    min_tokens: int
    n_p: int
    n_d: int
    bs_max: int
    step_s: float
    pd_prefill: PrefillTime
    link_gbps: float
    flow_cap_gbps: float | None
    rtt_s: float
    budget_gbps: float
    share_instances: float  # planned PrfaaS instances (the controller's wait estimate)
    share_weight: float  # DRR weight: planned uncached tokens/s sent to the PrfaaS cluster


@dataclass(frozen=True)
class RegionsConfig:
    regions: tuple[RegionSetup, ...]
    n_prfaas: int
    prfaas_prefill: PrefillTime
    kv: KVSize
    intra_gbps: float
    share_policy: str = "drr"
    controller: bool = True


class _Region:
    """Mutable state of one PD cluster during a run."""

    def __init__(self, setup: RegionSetup, work: Workload, cfg: RegionsConfig) -> None:
        n = len(work)
        self.setup, self.work = setup, work
        self.lengths = work.input_tokens.astype(float)
        self.prfaas_s = cfg.prfaas_prefill.time_s(self.lengths)
        self.local_s = setup.pd_prefill.time_s(self.lengths)
        self.kv_bytes = cfg.kv.size_bytes(self.lengths)
        self.offloaded = np.zeros(n, dtype=bool)
        self.kv_at = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.in_system_seen = np.zeros(n)
        self.prefill_done = np.zeros(n, dtype=bool)
        self.flow_done = np.zeros(n, dtype=bool)
        self.local_queue: deque[int] = deque()
        self.local_free = setup.n_p
        self.local_queued_s = 0.0
        self.slots = setup.n_d * setup.bs_max
        self.decode_wait: deque[int] = deque()
        self.link = SharedLink(LinkSchedule.constant(setup.link_gbps), setup.flow_cap_gbps)
        self.prfaas_queued_s = 0.0
        self.running, self.running_gbps = 0, 0.0
        self.busy_prfaas_s = 0.0
        self.in_system = 0
        self.budget = EgressBudget(setup.budget_gbps)
        self.held = 0  # picks at which the budget held this destination's queued jobs back
        self.link_points: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, bytes sent)
        self.control = DestinationThreshold(setup.threshold_tokens, setup.max_tokens,
                                            setup.min_tokens)


class RegionsSimulator:
    def __init__(self, cfg: RegionsConfig, workloads: Mapping[str, Workload]) -> None:
        self.cfg = cfg
        self.regions = [_Region(r, workloads[r.name], cfg) for r in cfg.regions]
        self.share: SharePolicy[int] = make_share_policy(
            cfg.share_policy, {r.name: max(r.share_weight, 1e-6) for r in cfg.regions})
        self.prfaas_free = cfg.n_prfaas
        self._phi_max_gbps = max_kv_gbps(cfg.prfaas_prefill, cfg.kv)
        self.now_s = 0.0
        self._heap: list[tuple[float, int, int, int, int, int]] = []
        self._seq = 0
        self.events = 0

    def _push(self, t: float, kind: int, k: int, i: int = 0, x: int = 0) -> None:
        heapq.heappush(self._heap, (t, kind, self._seq, k, i, x))
        self._seq += 1

    def run(self) -> RegionsSimulator:
        for k, reg in enumerate(self.regions):
            for i, t in enumerate(reg.work.arrival_s):
                self._push(float(t), ARRIVAL, k, i)
        handlers = {ARRIVAL: self._arrive, PREFILL_DONE: self._prefill_done,
                    LINK_DONE: self._link_done, KV_ARRIVE: self._kv_arrive,
                    DECODE_DONE: self._decode_done}
        while self._heap:
            t, kind, _, k, i, x = heapq.heappop(self._heap)
            self.now_s = t
            self.events += 1
            handlers[kind](k, i, x)
        return self

    def _arrive(self, k: int, i: int, _: int) -> None:
        reg = self.regions[k]
        reg.in_system_seen[i] = reg.in_system
        reg.in_system += 1
        t = reg.setup.threshold_tokens
        if self.cfg.controller:
            t = reg.control.update(self._prfaas_wait_s(reg),
                                   reg.local_queued_s / max(reg.setup.n_p, 1), self.now_s)
        if (self.cfg.n_prfaas and reg.lengths[i] > t) or reg.setup.n_p == 0:
            reg.offloaded[i] = True
            reg.prfaas_queued_s += reg.prfaas_s[i]
            self.share.push(reg.setup.name, k * (1 << 32) + i, reg.lengths[i])
            self._start_prfaas()
        else:
            reg.local_queue.append(i)
            reg.local_queued_s += reg.local_s[i]
            self._start_local(k)

    def _prfaas_wait_s(self, reg: _Region) -> float:
        """Its queued PrfaaS seconds over its planned share, or everyone's over the whole pool
        when that is less (the share policy is work-conserving: an idle tenant's time is
        anyone's)."""
        total = sum(r.prfaas_queued_s for r in self.regions) / max(self.cfg.n_prfaas, 1)
        return min(reg.prfaas_queued_s / max(reg.setup.share_instances, 1e-9), total)

    def _blocked(self) -> set[str]:
        """Destinations whose budget could not take one more prefill (at the highest KV rate
        one emits: the head job's length is the share policy's to know)."""
        return blocked_destinations({r.setup.name: r.budget for r in self.regions},
                                    {r.setup.name: r.running_gbps for r in self.regions},
                                    {r.setup.name: r.running for r in self.regions},
                                    self._phi_max_gbps)

    def _start_prfaas(self) -> None:
        while self.prfaas_free > 0:
            blocked = self._blocked()
            for reg in self.regions:
                if reg.setup.name in blocked and self.share.queued(reg.setup.name):
                    reg.held += 1
            picked = self.share.pick(blocked)
            if picked is None:
                return
            k, i = divmod(picked[1], 1 << 32)
            reg = self.regions[k]
            self.prfaas_free -= 1
            dur = float(reg.prfaas_s[i])
            reg.prfaas_queued_s -= dur
            reg.running += 1
            reg.running_gbps += float(reg.kv_bytes[i]) * 8 / 1e9 / dur
            reg.busy_prfaas_s += dur
            self._push(self.now_s + dur, PREFILL_DONE, k, i, PRFAAS)
            reg.link.start(self.now_s, i, float(reg.kv_bytes[i]))
            reg.link_points.append((self.now_s, reg.link.bytes_sent))
            self._schedule_link(k)

    def _start_local(self, k: int) -> None:
        reg = self.regions[k]
        while reg.local_free > 0 and reg.local_queue:
            i = reg.local_queue.popleft()
            reg.local_free -= 1
            reg.local_queued_s -= float(reg.local_s[i])
            self._push(self.now_s + float(reg.local_s[i]), PREFILL_DONE, k, i, LOCAL)

    def _schedule_link(self, k: int) -> None:
        link = self.regions[k].link
        when = link.next_finish_s()
        if when is not None:
            self._push(max(when, self.now_s), LINK_DONE, k, link.version)

    def _prefill_done(self, k: int, i: int, pool: int) -> None:
        reg = self.regions[k]
        if pool == LOCAL:
            reg.local_free += 1
            self._push(self.now_s + float(reg.kv_bytes[i]) / (self.cfg.intra_gbps
                                                               * BYTES_PER_GBPS), KV_ARRIVE, k, i)
            self._start_local(k)
            return
        self.prfaas_free += 1
        reg.running -= 1
        reg.running_gbps -= float(reg.kv_bytes[i]) * 8 / 1e9 / float(reg.prfaas_s[i])
        reg.prefill_done[i] = True
        if reg.flow_done[i]:
            self._push(self.now_s + reg.setup.rtt_s, KV_ARRIVE, k, i)
        self._start_prfaas()

    def _link_done(self, k: int, version: int, _: int) -> None:
        reg = self.regions[k]
        if version != reg.link.version:
            return  # superseded: a later start or finish rescheduled the link
        finished = reg.link.pop_finished(self.now_s)
        reg.link_points.append((self.now_s, reg.link.bytes_sent))
        for i in finished:
            reg.flow_done[i] = True
            if reg.prefill_done[i]:
                self._push(self.now_s + reg.setup.rtt_s, KV_ARRIVE, k, i)
        self._schedule_link(k)

    def _kv_arrive(self, k: int, i: int, _: int) -> None:
        reg = self.regions[k]
        reg.kv_at[i] = self.now_s
        reg.decode_wait.append(i)
        self._admit_decode(k)

    def _admit_decode(self, k: int) -> None:
        reg = self.regions[k]
        while reg.slots > 0 and reg.decode_wait:
            i = reg.decode_wait.popleft()
            reg.slots -= 1
            steps = int(reg.work.output_tokens[i])
            self._push(self.now_s + steps * reg.setup.step_s, DECODE_DONE, k, i)

    def _decode_done(self, k: int, i: int, _: int) -> None:
        reg = self.regions[k]
        reg.finish[i] = self.now_s
        reg.slots += 1
        reg.in_system -= 1
        self._admit_decode(k)
