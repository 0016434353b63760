"""Plug-in points of the simulator: how prefix caches and the role rebalancer join a run
without subclassing `Simulator` or touching its handlers.

A `SimPlugin` is a listener; every method has a do-nothing default. The simulator calls:
- `attach(sim)` once, before the first event (schedule own events with `sim.call_at`);
- `cached_tokens(req)` when request `req` arrives: cached-prefix tokens per prefill instance for
  the router's `RouteQuery` (the first plugin answering non-None wins);
- `on_decided(req, query, decision)` for every arriving request, once routed (accepted or not):
  what the router saw and chose (the shape controller's window);
- `on_routed(req, decision, prefill, cached)` once a request is accepted: a `Placement` (prefill
  service time, KV bytes to deliver, bytes that must cross the link first) replaces the default
  (full prefill minus `decision.cached_tokens`, the whole KV; first non-None wins);
- `on_prefill_done(req, prefill)` after a prefill ends and its successor has started;
- `on_decode_done(decoder)` after a decoder's finished sequences left and waiting ones joined.
Plugins see the simulator's public state (`log`, `cfg`, `now_s`, instance lists, `view`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prfaas.core.frozen import fast_init
from prfaas.core.types import RouteDecision, RouteQuery

if TYPE_CHECKING:
    from prfaas.sim.instances import DecodeInstance, PrefillInstance
    from prfaas.sim.simulator import Simulator


@fast_init
@dataclass(frozen=True, slots=True)
class Placement:
    """How an accepted request is served once routed."""

    service_s: float  # prefill service time on the chosen instance
    kv_bytes: float  # KV bytes delivered to the decode instance
    link_wait_bytes: float = 0.0  # bytes crossing the inter-cluster link before it may queue


class SimPlugin:
    """Base listener: every hook is a no-op."""

    def attach(self, sim: Simulator) -> None:
        """Called once before the run starts."""

    def cached_tokens(self, req: int) -> Mapping[str, int] | None:
        return None

    def on_decided(self, req: int, query: RouteQuery, decision: RouteDecision) -> None:
        """Request `req` was routed (`decision.rejected` when it was not accepted)."""

    def on_routed(self, req: int, decision: RouteDecision, prefill: PrefillInstance,
                  cached: Mapping[str, int]) -> Placement | None:
        return None

    def on_prefill_done(self, req: int, prefill: PrefillInstance) -> None:
        """`prefill` finished `req`."""

    def on_decode_done(self, decoder: DecodeInstance) -> None:
        """Sequences left `decoder` (its batch changed)."""
