"""Bounded prefill queues: a request whose chosen prefill instance is full spills to the
other route.

`SpillPolicy.admit(query, view, decision, waiting)` runs after the router decided, in the live
dispatcher (serve/dispatch.py) and in the simulator (sim/simulator.py). `waiting` is the
caller's count, per prefill instance, of requests routed there that have not produced their
first token yet (queued, prefilling, or with KV on the way). With `max_queued_per_prefill` set:
- KEEP: the chosen instance has fewer than the limit waiting;
- SPILL: it is full, and the other route's best prefill instance (`decide(..., fallback=False)`
  on PrfaaS for a PD-P choice and the reverse) has room: the local cluster keeps serving while
  PrfaaS is backed up, and the reverse; `decision` is that route's;
- FULL: both are full (or the other route cannot serve): the request is refused (429 with
  Retry-After live, counted as rejected in the simulator); `decision` is the refusal.
Without a limit, and for a decision that is already a refusal, every decision is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from prfaas.core.errors import ConfigError
from prfaas.core.types import ClusterView, Route, RouteDecision, RouteQuery
from prfaas.policy.base import decide


class SpillAction(StrEnum):
    KEEP = "keep"
    SPILL = "spill"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class SpillDecision:
    action: SpillAction
    decision: RouteDecision  # KEEP: the router's; SPILL: the other route's; FULL: the refusal


@dataclass(frozen=True, slots=True)
class SpillPolicy:
    max_queued_per_prefill: int | None = None  # requests waiting at one prefill instance

    def __post_init__(self) -> None:
        if self.max_queued_per_prefill is not None and self.max_queued_per_prefill < 1:
            raise ConfigError("max_queued_per_prefill", self.max_queued_per_prefill,
                              "must be >= 1")

    def admit(self, query: RouteQuery, view: ClusterView, decision: RouteDecision,
              waiting: Mapping[str, int]) -> SpillDecision:
        limit = self.max_queued_per_prefill
        if limit is None or decision.rejected or \
                waiting.get(decision.prefill_instance, 0) < limit:
            return SpillDecision(SpillAction.KEEP, decision)
        full = f"prefill queue of {decision.prefill_instance} is full ({limit} waiting)"
        other = Route.PD if decision.route is Route.PRFAAS else Route.PRFAAS
        spill = decide(query, view, other, decision.threshold_tokens, fallback=False)
        if (not spill.rejected and spill.decode_instance is not None
                and waiting.get(spill.prefill_instance, 0) < limit):
            return SpillDecision(SpillAction.SPILL, replace(spill, reason=f"{full}: spilled "
                                                                          f"to {other.value}"))
        return SpillDecision(SpillAction.FULL, RouteDecision.reject(
            f"{full} and no other route has room", decision.threshold_tokens))
