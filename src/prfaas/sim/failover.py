"""Instances and the inter-cluster link going down and coming back in the middle of a run.

The simulator's answer to a failure is the live router's (serve/dispatch.py): what was lost is
re-run on the local path. `Failover` owns that logic; scheduled outages (sim/outages.py) call
`instance_down/up` and `link_down/up` (reference-counted, so outages may overlap).
- A prefill instance goes down: it leaves the view; every request routed to it whose KV had not
  reached its decoder (running, queued, waiting for a prefix move, or with KV still in flight)
  is re-run: routed again with `decide(..., Route.PD)` (a PD-P instance; PrfaaS only when no
  PD-P instance is up and the link is) and prefilled from scratch. Its transfers are dropped.
- A decode instance goes down: it leaves the view; requests heading to it are re-targeted to
  another decoder (their KV is sent there: the prefill is not repeated); its running and waiting
  sequences are resumed: prompt + the tokens already emitted are re-prefilled on the local path
  and decoding continues for the steps left, on another decoder. The first token's time (TTFT)
  is the first one the user saw.
- The link goes down: `LinkStatus.up` is false in the view (policies route around it); every
  request whose KV or prefix was to cross it is re-run as above, and a decision that still
  names a PrfaaS instance or a cross-cluster prefix move is replaced by the local one.
- An instance comes back empty (a restart): queue, batch and in-flight work are gone.
A request no path can serve at that moment is lost (`lost`); `reruns` counts re-runs.
Approximations: failures are detected at once (the live router needs a health check or a KV
deadline); a prefix move already on the link completes even if its source instance goes down;
prefix caches survive an outage.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from prfaas.core.types import PRFAAS_CLUSTER, RequestInfo, Route, RouteDecision, RouteQuery
from prfaas.policy.base import decide, pick_decode
from prfaas.sim.instances import DecodeInstance, PrefillInstance
from prfaas.sim.plugin import Placement

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator

NAN = float("nan")


class Failover:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.lost: set[int] = set()
        self.reruns: Counter[int] = Counter()
        self._down: Counter[str] = Counter()
        self._link_down = 0

    # -- what the outages drive -----------------------------------------------------------
    def instance_down(self, inst: PrefillInstance | DecodeInstance) -> None:
        self._down[inst.instance_id] += 1
        if self._down[inst.instance_id] == 1:
            if isinstance(inst, PrefillInstance):
                self._prefill_down(inst)
            else:
                self._decoder_down(inst)

    def instance_up(self, inst: PrefillInstance | DecodeInstance) -> None:
        self._down[inst.instance_id] -= 1
        if self._down[inst.instance_id] == 0:
            inst.down = False
            self.sim.view.add(inst)

    def link_down(self) -> None:
        self._link_down += 1
        if self._link_down > 1:
            return
        sim = self.sim
        sim.link_down = True
        for p in sim.remote:
            p.abort(sim.now_s)  # its KV has nowhere to go
            sim.view.touch_prefill(p)
        self._rerun_where(lambda r: self._remote(r) or r in sim._held)

    def link_up(self) -> None:
        self._link_down -= 1
        if self._link_down == 0:
            self.sim.link_down = False

    # -- hooks the simulator calls ---------------------------------------------------------
    def off_link(self, decision: RouteDecision, query: RouteQuery) -> RouteDecision:
        """A decision that needs the (down) link, replaced by the local path's."""
        sim = self.sim
        prefill = sim.prefill_by_id[decision.prefill_instance]
        src = sim.prefill_by_id.get(decision.prefix_source or "")
        if prefill.cluster != PRFAAS_CLUSTER and (src is None or src.cluster == prefill.cluster):
            return decision
        return decide(query, sim.view, Route.PD, decision.threshold_tokens)

    def redeliver(self, req: int) -> DecodeInstance | None:
        """A decoder for KV whose decoder went down on the way (None: the request is lost)."""
        sim = self.sim
        load = pick_decode(sim.view)
        if load is None:
            self._lose(req)
            return None
        decoder = sim.decode_by_id[load.instance_id]
        sim._decoder_of[req] = decoder
        return decoder

    # -- internals ------------------------------------------------------------------------
    def _prefill_down(self, inst: PrefillInstance) -> None:
        sim = self.sim
        inst.down = True
        sim.view.remove(inst)
        inst.abort(sim.now_s)
        self._rerun_where(lambda r: sim._prefill_of[r] is inst)

    def _decoder_down(self, inst: DecodeInstance) -> None:
        sim = self.sim
        inst.down = True
        sim.view.remove(inst)
        on_it = inst.abort(sim.now_s)
        for r in range(sim._arrived):  # KV on its way: to another decoder
            if sim.stage[r] == 1 and sim._decoder_of[r] is inst:
                load = pick_decode(sim.view)
                new = sim.decode_by_id[load.instance_id] if load is not None else None
                sim._decoder_of[r] = new
                if new is not None:
                    new.inflight += 1
                    sim.view.touch_decode(new)
        for req, left in on_it:  # resumed from the tokens already out
            steps = sim.tokens_to_emit(req)
            self._rerun(req, steps if math.isinf(left) else max(math.ceil(left - 1e-9), 1))

    def _remote(self, req: int) -> bool:
        prefill = self.sim._prefill_of[req]
        return prefill is not None and prefill.cluster == PRFAAS_CLUSTER

    def _rerun_where(self, hit: Callable[[int], bool]) -> None:
        """Re-run every routed request whose KV has not arrived and that `hit(r)` selects."""
        sim = self.sim
        n = len(sim.log.arrival_s)
        affected = [r for r in range(sim._arrived) if sim.stage[r] == 1 and hit(r)]
        if not affected:
            return
        sim.link.cancel(sim.now_s, {*affected, *(n + r for r in affected)})
        for r in affected:
            held = sim._held.pop(r, None)
            if held is not None:
                held[0].held -= 1
            self._rerun(r, sim.tokens_to_emit(r))
        sim._schedule_link()

    def _rerun(self, req: int, steps_left: int) -> None:
        """Route the request again on the local path: prompt + emitted tokens to prefill,
        `steps_left` decode steps after."""
        sim, log = self.sim, self.sim.log
        decoder = sim._decoder_of[req]
        if sim.stage[req] == 1 and decoder is not None and not decoder.down:
            decoder.inflight -= 1
            sim.view.touch_decode(decoder)
        sim.attempt[req] += 1  # its pending KV arrival, if any, is void
        self.reruns[req] += 1
        sim.stage[req] = 0
        log.prefill_start_s[req] = log.prefill_end_s[req] = log.flow_start_s[req] = NAN
        sim._flow_done[req] = False
        emitted = log.output_tokens[req] - steps_left
        total = log.input_tokens[req] + emitted
        cached = sim._cached(req) if emitted == 0 else {}
        info = RequestInfo(str(req), total, steps_left, sim.now_s)
        decision = decide(RouteQuery(info, cached), sim.view, Route.PD,
                          sim.router.threshold_tokens())
        if decision.rejected:
            self._lose(req)
            return
        prefill = sim.prefill_by_id[decision.prefill_instance]
        new_decoder = sim.decode_by_id[decision.decode_instance or ""]
        if emitted:
            sim.resume_steps[req] = steps_left
            place = Placement(prefill.profile.seconds(total, decision.cached_tokens),
                              sim.cfg.kv.bytes_for(total))
        else:
            place = sim._placement(req, decision, prefill, cached)
        sim._admit(req, prefill, new_decoder, place)

    def _lose(self, req: int) -> None:
        self.lost.add(req)
        self.sim.stage[req] = 0
        self.sim.in_system -= 1
