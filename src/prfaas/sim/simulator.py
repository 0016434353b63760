"""The discrete-event simulator: requests -> router -> prefill queue -> KV transfer -> decode.

Event heap entries are (time_s, kind, seq, a, b): ties at one instant resolve by kind (resources
are freed before new work arrives), then by insertion order, so a run is deterministic. Events
exist only where state changes: arrival, prefill end, link flow end, KV arrival, decode leave,
link capacity change, state changes (outages, `call_at(..., before_arrivals=True)`), arrival,
then plugin callbacks (`call_at`). Every request is routed by a `Router`
through `SimView`, the simulator's `ClusterView`. Prefix caches and the role rebalancer are
`SimPlugin`s (plugin.py): listeners called at fixed points, not subclasses.

A remote (PrfaaS) transfer shares the inter-cluster link (see link.py), by processor sharing or,
with `cfg.link_order == "fifo"`, one transfer at a time in start order. Pipelined: the flow
joins at prefill start and ends at the later of its bandwidth-limited finish and prefill end plus
the last layer's share (or, with `cfg.kv_release`, the bound its chunks and recurrent state set:
models/kv_release.py); otherwise it joins at prefill end. Local transfers run unshared at the
intra-cluster rate with the same overlap rule. TTFT ends when the whole KV (and with it the
first token) is at the decode instance, plus the route's fixed overhead when one was measured
(`cfg.local_overhead_s` / `remote_overhead_s`: hops and first step; it delays no one). A
request whose placement has `link_wait_bytes` (a prefix move) joins its prefill queue once
those bytes have crossed the shared link. Every transfer across the inter-cluster link arrives
`cfg.rtt_s` later (models/tcp.py).

Prefill instances the configuration puts on shared cores (`cfg.core_groups`) slow each other
while their prefills overlap (processor sharing, sim/sharing.py): a start or finish in a group
moves the end of every prefill running there, and the routing view sees the moved drain times.

With `cfg.max_queued_per_prefill`, a decision whose prefill instance already has that many
requests waiting for their first token spills to the other route or is rejected (policy/spill.py,
the live dispatcher's object; `spilled`, `queue_full`).

Instances and the link can go down and come back mid-run (`Failover`, sim/failover.py; driven
by scheduled outages, sim/outages.py): a prefill-done event carries its instance's version and
a KV arrival its request's attempt number, so work a failure cancelled leaves no stale event.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from heapq import heappush

from prfaas.core.errors import ConfigError
from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    RequestInfo,
    RouteDecision,
    RouteQuery,
)
from prfaas.policy.base import Router, make_router
from prfaas.policy.spill import SpillAction, SpillPolicy
from prfaas.sim.failover import Failover
from prfaas.sim.instances import DecodeInstance, PrefillInstance, instance_id
from prfaas.sim.link import BYTES_PER_GBPS, make_link
from prfaas.sim.plugin import Placement, SimPlugin
from prfaas.sim.request_log import RequestLog
from prfaas.sim.sharing import CoreGroup
from prfaas.sim.system import SystemConfig
from prfaas.sim.view import SimView
from prfaas.workload.requests import Workload

DECODE_DONE, LINK_DONE, KV_ARRIVE, PREFILL_DONE, LINK_CHANGE, STATE_CHANGE, ARRIVAL, CALLBACK = \
    range(8)
NO_CACHE: Mapping[str, int] = {}
NAN = float("nan")


class Simulator:
    def __init__(self, cfg: SystemConfig, workload: Workload, router: Router | None = None,
                 plugins: Sequence[SimPlugin] = (), candidate_limit: int | None = None) -> None:
        self.cfg = cfg
        self.workload = workload
        self.router = router or make_router(cfg.router, **(
            {"threshold_tokens": cfg.threshold_tokens} if cfg.threshold_tokens is not None
            else {}))
        self.plugins = tuple(plugins)
        self.remote = [PrefillInstance(instance_id("prfaas-p", i), PRFAAS_CLUSTER,
                                       cfg.prfaas_prefill, cfg.prefill_order)
                       for i in range(cfg.n_prfaas) if cfg.prfaas_prefill is not None]
        self.local = [PrefillInstance(instance_id("pd-p", i), PD_CLUSTER, cfg.pd_prefill,
                                      cfg.prefill_order)
                      for i in range(cfg.n_p) if cfg.pd_prefill is not None]
        self.decoders = [DecodeInstance(instance_id("pd-d", i), PD_CLUSTER, cfg.decode)
                         for i in range(cfg.n_d)]
        self.prefills = self.remote + self.local
        for k, inst in enumerate(self.prefills):
            inst.index = k
        for k, dec in enumerate(self.decoders):
            dec.index = k
        self.prefill_by_id = {p.instance_id: p for p in self.prefills}
        for ids in cfg.core_groups:  # prefill instances on shared cores (sim/sharing.py)
            group = CoreGroup(cfg.core_share_factor)
            for member in ids:
                if member not in self.prefill_by_id:
                    raise ConfigError("core_groups", member,
                                      f"not a prefill instance of this system "
                                      f"({sorted(self.prefill_by_id)})")
                self.prefill_by_id[member].share = group
        self.decode_by_id = {d.instance_id: d for d in self.decoders}
        self.link = make_link(cfg.link, cfg.flow_cap_gbps, cfg.link_order)
        self.view = SimView(self, candidate_limit)
        self.now_s = 0.0
        self.events = 0
        self.in_system = 0
        self.in_system_at_arrival: list[int] = []
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._callbacks: dict[int, Callable[[], None]] = {}
        n = len(workload)
        nan = float("nan")
        self.log = RequestLog(
            workload.arrival_s.tolist(), workload.input_tokens.tolist(),
            workload.output_tokens.tolist(), [False] * n, [False] * n, [-1] * n, [nan] * n,
            [nan] * n, [nan] * n, [nan] * n, [0.0] * n, [nan] * n)
        self._decoder_of: list[DecodeInstance | None] = [None] * n
        self._prefill_of: list[PrefillInstance | None] = [None] * n
        self._flow_done = [False] * n
        self._held: dict[int, tuple[PrefillInstance, float]] = {}  # waiting on a link move
        self._arrived = 0
        self._rtt_s = cfg.rtt_s
        self._pipelined = cfg.pipelined
        self._local_overhead_s = cfg.local_overhead_s
        self._remote_overhead_s = cfg.remote_overhead_s
        # failures (sim/failover.py): attempt number and stage of each request (0 not
        # admitted, 1 routed, 2 at its decoder, 3 done), steps left of resumed requests
        self.attempt = [0] * n
        self.stage = [0] * n
        self.resume_steps: dict[int, int] = {}
        self.link_down = False
        self.failover = Failover(self)
        # bounded prefill queues (policy/spill.py, the live dispatcher's object): requests
        # routed to each prefill instance whose KV (the first token) has not reached their
        # decoder, as the live router counts attempts waiting for their first token
        self.spill = SpillPolicy(cfg.max_queued_per_prefill)
        self.awaiting_first_token: Counter[str] = Counter()
        self.spilled = 0  # requests moved to the other route by the spill
        self.queue_full = 0  # requests refused with both routes' queues full

    # -- event plumbing ---------------------------------------------------------------------
    def _push(self, time_s: float, kind: int, a: int = 0, b: int = 0) -> None:
        self._seq = seq = self._seq + 1
        heappush(self._heap, (time_s, kind, seq, a, b))

    def call_at(self, time_s: float, fn: Callable[[], None], before_arrivals: bool = False
                ) -> None:
        """Run `fn()` at `time_s`: after the simulator's own events of that instant, or with
        `before_arrivals` (a change of the system's state, e.g. an outage) before the
        requests arriving at that instant are routed."""
        self._callbacks[self._seq + 1] = fn
        self._push(time_s, STATE_CHANGE if before_arrivals else CALLBACK, self._seq + 1)

    def busy(self) -> bool:
        """Work remains: requests still to arrive, in the system, or waiting on the link."""
        return self._arrived < len(self.log.arrival_s) or self.in_system > 0

    def run(self) -> Simulator:
        for plugin in self.plugins:
            plugin.attach(self)
        if len(self.workload):
            self._push(self.log.arrival_s[0], ARRIVAL, 0)
        change = self.cfg.link.next_change_s(0.0)
        if change is not None:
            self._push(change, LINK_CHANGE)
        handlers = (self._on_decode_done, self._on_link_done, self._on_kv_arrive,
                    self._on_prefill_done, self._on_link_change, self._on_callback,
                    self._on_arrival, self._on_callback)
        heap = self._heap
        pop = heapq.heappop
        last_s = 0.0
        events = self.events
        try:
            while heap:
                time_s, kind, _, a, b = pop(heap)
                self.now_s = time_s
                events += 1
                handlers[kind](a, b)
                if kind < STATE_CHANGE or kind == ARRIVAL:
                    last_s = time_s
        finally:
            self.events = events  # (counted locally: the loop's hottest line)
        # a plugin's trailing timer (e.g. the rebalancer's last tick) does not stretch the run
        self.now_s = last_s
        return self

    # -- instances joining and leaving roles (the rebalancer) --------------------------------
    def stop_routing(self, instance: PrefillInstance | DecodeInstance) -> None:
        """The router no longer sees `instance`; what it holds still completes."""
        self.view.remove(instance)

    def add_local_prefill(self, instance_id: str) -> PrefillInstance:
        assert self.cfg.pd_prefill is not None, "the system has no PD prefill profile"
        inst = PrefillInstance(instance_id, PD_CLUSTER, self.cfg.pd_prefill,
                               self.cfg.prefill_order, self.now_s)
        inst.index = len(self.prefills)
        self.prefills.append(inst)
        self.local.append(inst)
        self.prefill_by_id[instance_id] = inst
        self.view.add(inst)
        return inst

    def add_decoder(self, instance_id: str) -> DecodeInstance:
        dec = DecodeInstance(instance_id, PD_CLUSTER, self.cfg.decode, self.now_s)
        dec.index = len(self.decoders)
        self.decoders.append(dec)
        self.decode_by_id[instance_id] = dec
        self.view.add(dec)
        return dec

    def start_routing(self, instance: PrefillInstance | DecodeInstance) -> None:
        """The router sees `instance` again (back from an outage)."""
        self.view.add(instance)

    # -- what failover drives (sim/failover.py: `FailoverHost`) ------------------------------
    def request_query(self, req: int, cached: bool = True) -> RouteQuery:
        """The request as it arrived; with `cached`, its cached prefixes (the cache plugins')."""
        log = self.log
        info = RequestInfo(str(req), log.input_tokens[req], log.output_tokens[req],
                           log.arrival_s[req])
        return RouteQuery(info, self._cached(req) if cached else NO_CACHE)

    def awaiting_kv(self) -> list[int]:
        """Routed requests whose KV has not reached their decoder, in arrival order."""
        stage = self.stage
        return [r for r in range(self._arrived) if stage[r] == 1]

    def prefill_of(self, req: int) -> PrefillInstance | None:
        return self._prefill_of[req]

    def decoder_of(self, req: int) -> DecodeInstance | None:
        return self._decoder_of[req]

    def waits_on_link(self, req: int) -> bool:
        """The request's prefill waits for a prefix move across the link."""
        return req in self._held

    def redirect_kv(self, req: int, decoder: DecodeInstance | None) -> None:
        """KV on its way to a decoder that went down goes to `decoder` (None: none is up)."""
        self._decoder_of[req] = decoder
        if decoder is not None:
            decoder.inflight += 1
            self.view.touch_decode(decoder)

    def cancel_transfers(self, reqs: Sequence[int]) -> None:
        """Take the requests' KV flows and prefix moves off the link (then `reschedule_link`)."""
        n = len(self.log.arrival_s)
        self.link.cancel(self.now_s, {*reqs, *(n + r for r in reqs)})

    def reschedule_link(self) -> None:
        self._schedule_link()

    def withdraw(self, req: int) -> None:
        """Undo the request's routing before it is routed again: off its prefix move, its
        decoder's count and the waiting count of its prefill; its pending KV arrival void."""
        held = self._held.pop(req, None)
        if held is not None:
            held[0].held -= 1
        if self.stage[req] == 1:
            prefill, decoder = self._prefill_of[req], self._decoder_of[req]
            if prefill is not None:
                self.awaiting_first_token[prefill.instance_id] -= 1
            if decoder is not None and not decoder.down:
                decoder.inflight -= 1
                self.view.touch_decode(decoder)
        self.attempt[req] += 1
        self.stage[req] = 0
        log = self.log
        log.prefill_start_s[req] = log.prefill_end_s[req] = log.flow_start_s[req] = NAN
        self._flow_done[req] = False

    def readmit(self, req: int, query: RouteQuery, decision: RouteDecision, resumed: bool
                ) -> None:
        """Route a withdrawn request again: `query` is what it is now (resumed: prompt +
        emitted tokens to prefill, `output_tokens` decode steps left) and `decision` where."""
        prefill = self.prefill_by_id[decision.prefill_instance]
        decoder = self.decode_by_id[decision.decode_instance or ""]
        if resumed:
            self.resume_steps[req] = query.request.output_tokens
            total = query.request.input_tokens
            place = Placement(prefill.profile.seconds(total, decision.cached_tokens),
                              self.cfg.kv.bytes_for(total))
        else:
            place = self._placement(req, decision, prefill, query.cached_tokens)
        self._admit(req, prefill, decoder, place)

    def drop(self, req: int) -> None:
        """The request is lost: no path could serve it when it had to be re-run."""
        self.stage[req] = 0
        self.in_system -= 1

    # -- handlers ---------------------------------------------------------------------------
    def _on_arrival(self, i: int, _: int) -> None:
        log, now = self.log, self.now_s
        self._arrived = i + 1
        if i + 1 < len(log.arrival_s):
            self._push(log.arrival_s[i + 1], ARRIVAL, i + 1)
        self.in_system_at_arrival.append(self.in_system)
        cached = self._cached(i) if self.plugins else NO_CACHE
        query = RouteQuery(RequestInfo(str(i), log.input_tokens[i], log.output_tokens[i], now),
                           cached)
        decision = self.router.route(query, self.view)
        if self.link_down and not decision.rejected:
            decision = self.failover.off_link(decision, query)
        if self.spill.max_queued_per_prefill is not None:  # (no call per arrival without)
            decision = self._spill(query, decision)
        t = self.router.threshold_tokens()
        log.threshold_tokens[i] = -1 if t is None else t
        for plugin in self.plugins:
            plugin.on_decided(i, query, decision)
        decoder = self.decode_by_id.get(decision.decode_instance or "")
        prefill = self.prefill_by_id.get(decision.prefill_instance)
        if decision.rejected or decoder is None or prefill is None:
            log.rejected[i] = True
            return
        self.in_system += 1
        if self.plugins:
            self._admit(i, prefill, decoder, self._placement(i, decision, prefill, cached))
            return
        total = log.input_tokens[i]  # _placement's default, without the Placement object
        self._admit_at(i, prefill, decoder, prefill.profile.seconds(total, decision.cached_tokens),
                       self.cfg.kv.bytes_for(total))

    def _spill(self, query: RouteQuery, decision: RouteDecision) -> RouteDecision:
        verdict = self.spill.admit(query, self.view, decision, self.awaiting_first_token)
        if verdict.action is SpillAction.SPILL:
            self.spilled += 1
        elif verdict.action is SpillAction.FULL:
            self.queue_full += 1
        return verdict.decision

    def _admit(self, i: int, prefill: PrefillInstance, decoder: DecodeInstance,
               place: Placement) -> None:
        """Count the request on its decoder and queue its prefill (or its prefix move)."""
        self._admit_at(i, prefill, decoder, place.service_s, place.kv_bytes,
                       place.link_wait_bytes)

    def _admit_at(self, i: int, prefill: PrefillInstance, decoder: DecodeInstance,
                  service_s: float, kv_bytes: float, link_wait_bytes: float = 0.0) -> None:
        log = self.log
        decoder.inflight += 1
        self.view.touch_decode(decoder)
        self._decoder_of[i] = decoder
        self._prefill_of[i] = prefill
        self.stage[i] = 1
        self.awaiting_first_token[prefill.instance_id] += 1
        log.remote[i] = prefill.cluster == PRFAAS_CLUSTER
        log.kv_bytes[i] = kv_bytes
        if link_wait_bytes > 0:
            # the prefill waits for a prefix move on the shared link (flow id past the requests)
            self._held[i] = (prefill, service_s)
            prefill.held += 1
            self.link.start(self.now_s, len(log.arrival_s) + i, link_wait_bytes)
            self._schedule_link()
            return
        self._enqueue(i, prefill, service_s)

    def _cached(self, i: int) -> Mapping[str, int]:
        for plugin in self.plugins:
            cached = plugin.cached_tokens(i)
            if cached is not None:
                return cached
        return NO_CACHE

    def _placement(self, i: int, decision: RouteDecision, prefill: PrefillInstance,
                   cached: Mapping[str, int]) -> Placement:
        for plugin in self.plugins:
            place = plugin.on_routed(i, decision, prefill, cached)
            if place is not None:
                return place
        total = self.log.input_tokens[i]
        return Placement(prefill.profile.seconds(total, decision.cached_tokens),
                         self.cfg.kv.bytes_for(total))

    def _enqueue(self, req: int, prefill: PrefillInstance, service_s: float) -> None:
        prefill.enqueue(req, service_s)
        if prefill.running < 0:
            self._start_prefill(prefill)
        self.view.touch_prefill(prefill)

    def _start_prefill(self, prefill: PrefillInstance) -> None:
        started = prefill.start_next(self.now_s)
        if started is None:
            return
        req, end_s = started
        log = self.log
        log.prefill_start_s[req] = self.now_s
        if prefill.share is None:
            self._push(end_s, PREFILL_DONE, prefill.index, prefill.version)
        else:
            self._retimed(prefill.share.start(prefill, end_s - self.now_s, self.now_s))
        if log.remote[req] and self._pipelined:
            self._start_flow(req)

    def abort_prefill(self, instance: PrefillInstance) -> None:
        """`instance` drops its running and queued prefills (it went down, or its link did); the
        others on its cores speed up at once (sim/sharing.py)."""
        instance.abort(self.now_s)
        if instance.share is not None:
            self._retimed(instance.share.finish(instance, self.now_s))

    def _retimed(self, moved: list[PrefillInstance], skip: PrefillInstance | None = None
                 ) -> None:
        """Prefills whose end moved (a shared core's load changed): their new end events, and
        the routing view's drain times (`skip`: touched by the caller)."""
        for inst in moved:
            self._push(inst.busy_until_s, PREFILL_DONE, inst.index, inst.version)
            if inst is not skip:
                self.view.touch_prefill(inst)

    def _start_flow(self, req: int) -> None:
        self.log.flow_start_s[req] = self.now_s
        self.link.start(self.now_s, req, self.log.kv_bytes[req])
        self._schedule_link()

    def _schedule_link(self) -> None:
        at = self.link.next_finish_s()
        if at is not None:
            self._push(at, LINK_DONE, 0, self.link.version)

    def _last_layer_s(self, req: int, rate_bps: float) -> float:
        return self.log.kv_bytes[req] / self.cfg.kv_layers / rate_bps

    def _sent_by_s(self, req: int, rate_bps: float) -> float:
        """Pipelined: the earliest the whole KV of `req` (prefill over) can be across at
        `rate_bps`, given when its pieces were released: the last layer's share after
        prefill end, or `cfg.kv_release`'s chunks and state (models/kv_release.py)."""
        log, release = self.log, self.cfg.kv_release
        end = float(log.prefill_end_s[req])
        if release is None:
            return end + self._last_layer_s(req, rate_bps)
        return release.ready_s(int(log.input_tokens[req]), float(log.kv_bytes[req]),
                               float(log.prefill_start_s[req]), end, rate_bps)

    def _on_prefill_done(self, index: int, version: int) -> None:
        prefill = self.prefills[index]
        if version != prefill.version:
            return  # the instance went down meanwhile: its work was re-run elsewhere
        req = prefill.finish()
        log, now = self.log, self.now_s
        log.prefill_end_s[req] = now
        if prefill.share is not None:
            self._retimed(prefill.share.finish(prefill, now), prefill)
        if log.remote[req]:
            if not self.cfg.pipelined:
                self._start_flow(req)
            elif self._flow_done[req]:
                rate = min(self.link.flow_cap_bps, self.link.capacity_gbps() * BYTES_PER_GBPS)
                self._push(self._sent_by_s(req, rate) + self._rtt_s, KV_ARRIVE, req,
                           self.attempt[req])
        else:
            rate = self.cfg.intra_gbps * BYTES_PER_GBPS
            whole = log.kv_bytes[req] / rate
            ready = max(log.prefill_start_s[req] + whole, self._sent_by_s(req, rate)) \
                if self.cfg.pipelined else now + whole
            self._push(ready, KV_ARRIVE, req, self.attempt[req])
        self._start_prefill(prefill)
        self.view.touch_prefill(prefill)
        for plugin in self.plugins:
            plugin.on_prefill_done(req, prefill)

    def _on_link_done(self, _: int, version: int) -> None:
        if version != self.link.version:
            return  # superseded by a later join, finish or capacity change
        now, n = self.now_s, len(self.log.arrival_s)
        for flow in self.link.pop_finished(now):
            if flow >= n:  # a prefix move: the prefill that waited for it may queue
                if self._rtt_s:
                    self.call_at(now + self._rtt_s, partial(self._release, flow - n))
                else:
                    self._release(flow - n)
                continue
            self._flow_done[flow] = True
            end = self.log.prefill_end_s[flow]
            if end == end:  # prefill already over (not nan): the transfer is complete
                sent = self._sent_by_s(flow, self.link.flow_rate_bps()) \
                    if self.cfg.pipelined else end
                self._push(max(now, sent) + self._rtt_s, KV_ARRIVE, flow,
                           self.attempt[flow])
        self._schedule_link()

    def _release(self, req: int) -> None:
        """A prefix move arrived: the prefill that waited for it may queue."""
        if req not in self._held:
            return  # re-run elsewhere while the move was on its way
        prefill, service_s = self._held.pop(req)
        prefill.held -= 1
        self._enqueue(req, prefill, service_s)

    def _on_link_change(self, _: int, __: int) -> None:
        self.link.set_capacity(self.now_s, self.cfg.link.at(self.now_s))
        self._schedule_link()
        change = self.cfg.link.next_change_s(self.now_s)
        if change is not None and self._heap:
            self._push(change, LINK_CHANGE)

    def _on_callback(self, key: int, _: int) -> None:
        self._callbacks.pop(key)()

    def _on_kv_arrive(self, req: int, attempt: int) -> None:
        if attempt != self.attempt[req]:
            return  # an attempt a failure cancelled
        log = self.log
        if log.kv_ready_s[req] != log.kv_ready_s[req]:  # nan: the first token only once
            log.kv_ready_s[req] = self.now_s + (self._remote_overhead_s if log.remote[req]
                                                else self._local_overhead_s)
        self.stage[req] = 2
        prefill = self._prefill_of[req]
        assert prefill is not None  # routed (stage 1) before its KV could arrive
        self.awaiting_first_token[prefill.instance_id] -= 1
        decoder = self._decoder_of[req]
        if decoder is None:  # its decoder went down and none was up to take over
            decoder = self.failover.redeliver(req)
            if decoder is None:
                return
            self._decoder_of[req] = decoder
        else:
            decoder.inflight -= 1
        if decoder.has_slot() and not decoder.waiting:
            steps = self.resume_steps  # (tokens_to_emit, inlined: the hot path)
            decoder.join(self.now_s, req, steps.get(req, log.output_tokens[req]) if steps
                         else log.output_tokens[req])
            self._schedule_decoder(decoder)
        else:
            decoder.waiting.append(req)
        self.view.touch_decode(decoder)  # a redelivered request adds to its occupancy

    def tokens_to_emit(self, req: int) -> int:
        """Decode steps of the request's current attempt (fewer once resumed)."""
        steps = self.resume_steps
        return steps.get(req, self.log.output_tokens[req]) if steps else \
            self.log.output_tokens[req]

    def _schedule_decoder(self, decoder: DecodeInstance) -> None:
        at = decoder.next_finish_s()
        if at is not None:
            self._push(at, DECODE_DONE, decoder.index, decoder.version)

    def _on_decode_done(self, index: int, version: int) -> None:
        decoder = self.decoders[index]
        if version != decoder.version:
            return
        now = self.now_s
        for req in decoder.pop_finished(now):
            self.log.finish_s[req] = now
            self.stage[req] = 3
            self.in_system -= 1
        while decoder.waiting and decoder.has_slot():
            req = decoder.waiting.popleft()
            decoder.join(now, req, self.tokens_to_emit(req))
        self._schedule_decoder(decoder)
        self.view.touch_decode(decoder)
        for plugin in self.plugins:
            plugin.on_decode_done(decoder)
