"""Instances and the inter-cluster link going down and coming back in the middle of a run.

The simulator's answer to a failure is the live router's: what is re-run where is decided by
the same `RetryPolicy` (policy/retry.py) the live dispatcher calls, here without a retry limit
(an outage is never the request's fault). `Failover` finds the requests a failure hit and
drives the simulator through the narrow interface `FailoverHost` (withdraw, readmit, drop, ...);
scheduled outages (sim/outages.py) call `instance_down/up` and `link_down/up`
(reference-counted, so outages may overlap).
- A prefill instance goes down: it leaves the view; every request routed to it whose KV had not
  reached its decoder (running, queued, waiting for a prefix move, or with KV still in flight)
  is re-run: the policy's RETRY (the local path: a PD-P instance; PrfaaS only when no PD-P
  instance is up and the link is), prefilled from scratch. Its transfers are dropped.
- A decode instance goes down: it leaves the view; requests heading to it are re-targeted to
  another decoder (their KV is sent there: the prefill is not repeated); its running and waiting
  sequences are resumed (the policy's RESUME): prompt + the tokens already emitted are
  re-prefilled on the local path and decoding continues for the steps left, on another decoder
  (the prefix caches are not consulted for a resumed prompt). The first token's time (TTFT) is
  the first one the user saw.
- The link goes down: `LinkStatus.up` is false in the view (policies route around it); every
  request whose KV or prefix was to cross it is re-run as above, and a decision that still
  names a PrfaaS instance or a cross-cluster prefix move is replaced by the local one.
- An instance comes back empty (a restart): queue, batch and in-flight work are gone.
A request no path can serve at that moment (the policy's NO_PATH) is lost (`lost`); `reruns`
counts re-runs.
Approximations: failures are detected at once (the live router needs a health check or a KV
deadline); a prefix move already on the link completes even if its source instance goes down;
prefix caches survive an outage.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prfaas.core.types import PRFAAS_CLUSTER, Route, RouteDecision, RouteQuery
from prfaas.policy.base import Router, decide, pick_decode
from prfaas.policy.retry import FailedRequest, RetryAction, RetryPolicy
from prfaas.sim.instances import DecodeInstance, PrefillInstance

if TYPE_CHECKING:
    from prfaas.sim.view import SimView


class FailoverHost(Protocol):
    """What `Failover` may see and do of the simulator (sim/simulator.py implements it)."""

    link_down: bool

    @property
    def now_s(self) -> float: ...
    @property
    def view(self) -> SimView: ...
    @property
    def router(self) -> Router: ...
    @property
    def remote(self) -> Sequence[PrefillInstance]: ...
    @property
    def prefill_by_id(self) -> Mapping[str, PrefillInstance]: ...
    @property
    def decode_by_id(self) -> Mapping[str, DecodeInstance]: ...

    def stop_routing(self, instance: PrefillInstance | DecodeInstance) -> None: ...
    def start_routing(self, instance: PrefillInstance | DecodeInstance) -> None: ...
    def abort_prefill(self, instance: PrefillInstance) -> None: ...
    def request_query(self, req: int, cached: bool = True) -> RouteQuery: ...
    def tokens_to_emit(self, req: int) -> int: ...
    def awaiting_kv(self) -> list[int]: ...
    def prefill_of(self, req: int) -> PrefillInstance | None: ...
    def decoder_of(self, req: int) -> DecodeInstance | None: ...
    def waits_on_link(self, req: int) -> bool: ...
    def redirect_kv(self, req: int, decoder: DecodeInstance | None) -> None: ...
    def cancel_transfers(self, reqs: Sequence[int]) -> None: ...
    def reschedule_link(self) -> None: ...
    def withdraw(self, req: int) -> None: ...
    def readmit(self, req: int, query: RouteQuery, decision: RouteDecision, resumed: bool
                ) -> None: ...
    def drop(self, req: int) -> None: ...


class Failover:
    def __init__(self, sim: FailoverHost) -> None:
        self.sim = sim
        self.policy = RetryPolicy(max_retries=None)
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
            self.sim.start_routing(inst)

    def link_down(self) -> None:
        self._link_down += 1
        if self._link_down > 1:
            return
        sim = self.sim
        sim.link_down = True
        for p in sim.remote:
            sim.abort_prefill(p)  # its KV has nowhere to go
            sim.view.touch_prefill(p)
        self._rerun_where(lambda r: self._remote(r) or sim.waits_on_link(r))

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
        return sim.decode_by_id[load.instance_id]

    # -- internals ------------------------------------------------------------------------
    def _prefill_down(self, inst: PrefillInstance) -> None:
        sim = self.sim
        inst.down = True
        sim.stop_routing(inst)
        sim.abort_prefill(inst)
        self._rerun_where(lambda r: sim.prefill_of(r) is inst)

    def _decoder_down(self, inst: DecodeInstance) -> None:
        sim = self.sim
        inst.down = True
        sim.stop_routing(inst)
        on_it = inst.abort(sim.now_s)
        for r in sim.awaiting_kv():  # KV on its way: to another decoder
            if sim.decoder_of(r) is inst:
                load = pick_decode(sim.view)
                sim.redirect_kv(r, sim.decode_by_id[load.instance_id] if load is not None
                                else None)
        for req, left in on_it:  # resumed from the tokens already out
            steps = sim.tokens_to_emit(req)
            self._rerun(req, steps if math.isinf(left) else max(math.ceil(left - 1e-9), 1))

    def _remote(self, req: int) -> bool:
        prefill = self.sim.prefill_of(req)
        return prefill is not None and prefill.cluster == PRFAAS_CLUSTER

    def _rerun_where(self, hit: Callable[[int], bool]) -> None:
        """Re-run every routed request whose KV has not arrived and that `hit(r)` selects."""
        sim = self.sim
        affected = [r for r in sim.awaiting_kv() if hit(r)]
        if not affected:
            return
        sim.cancel_transfers(affected)
        for r in affected:
            self._rerun(r, sim.tokens_to_emit(r))
        sim.reschedule_link()

    def _rerun(self, req: int, steps_left: int) -> None:
        """Withdraw the request and route it where the retry policy says, with `steps_left`
        decode steps after its prefill."""
        sim = self.sim
        sim.withdraw(req)
        self.reruns[req] += 1
        emitted = sim.request_query(req, cached=False).request.output_tokens - steps_left
        # a resumed prompt skips the prefix caches: they model the prompt's blocks, and a
        # resume's placement is not the cache plugins' to make
        failed = FailedRequest(sim.request_query(req, cached=emitted == 0), emitted,
                               threshold_tokens=sim.router.threshold_tokens())
        verdict = self.policy.after_failure(failed, sim.view)
        if verdict.action is RetryAction.NO_PATH:
            self._lose(req)
            return
        # never FINISHED (a re-run has a step left) nor GIVE_UP (no limit, one sequence)
        assert verdict.query is not None and verdict.decision is not None, verdict
        sim.readmit(req, verdict.query, verdict.decision,
                    resumed=verdict.action is RetryAction.RESUME)

    def _lose(self, req: int) -> None:
        self.lost.add(req)
        self.sim.drop(req)
