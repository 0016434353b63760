"""The routing-policy interface and its registry.

A `Router` turns a `RouteQuery` (request + cached-prefix lengths per instance) and a
`ClusterView` into a `RouteDecision`. It reads no clock (time is `view.now_s`) and holds no
sockets, so the simulator and the live router call the same object.

Down parts (core/types.py): a down instance is absent from the view; while the link is down
(`link_usable` false) the PrfaaS cluster counts as absent (`remote_prefill` is empty). Every
router then degrades the same way: a request the policy wants on PrfaaS prefills on a PD-P
instance; one it wants local prefills on PrfaaS only when no PD-P instance is up and the link
is; with no usable prefill instance, or no decode instance, the decision is
`RouteDecision.no_path` with the reason (503 live, counted as rejected in the simulator).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.core.pool import RankedPool
from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    ClusterView,
    InstanceLoad,
    Route,
    RouteDecision,
    RouteQuery,
    link_usable,
)


class Router(ABC):
    """Base of every routing policy."""

    name: str = "router"

    @abstractmethod
    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        """Decide where the request's prefill and decode run."""

    def threshold_tokens(self) -> int | None:
        """The length threshold in force, if the policy has one."""
        return None

    def threshold_limits_tokens(self) -> tuple[int, int] | None:
        """The range a controlled t can move in now, (everything offloaded, nothing
        offloaded), if the policy moves its t."""
        return None


RouterFactory = Callable[..., Router]
_REGISTRY: dict[str, RouterFactory] = {}


def register(name: str) -> Callable[[RouterFactory], RouterFactory]:
    def wrap(factory: RouterFactory) -> RouterFactory:
        _REGISTRY[name] = factory
        return factory
    return wrap


def _load_all() -> None:
    # importing the implementations fills the registry
    from prfaas.policy import cache_aware, controlled, mooncake, threshold  # noqa: F401


# what callers hand every router (the simulator, the live router); a router that has no use
# for one of these ignores it. Any other key must be a parameter of the router, so a typo in a
# topology's or scenario's `policy:` section is an error, not a silent no-op.
CONTEXT_KEYS = frozenset({"threshold_tokens", "plan_inputs", "controller"})


def _parameters(factory: RouterFactory) -> set[str]:
    """Named parameters of a router factory (a class's __init__ or a function), plus those it
    forwards (`factory.forwards`: another factory whose keywords it passes on)."""
    target = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]
    named = {p.name for p in inspect.signature(target).parameters.values()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
    forwards = getattr(factory, "forwards", None)
    return named | (_parameters(forwards) if forwards is not None else set())


def make_router(name: str, ttft_slo_s: float | None = None, **kwargs: Any) -> Router:
    """The registered router `name`; with `ttft_slo_s`, wrapped in TTFT-SLO admission control
    (`policy.admission`). Keys outside the router's parameters and CONTEXT_KEYS are rejected."""
    _load_all()
    if name not in _REGISTRY:
        raise UnknownNameError("policy", name, list(_REGISTRY))
    factory = _REGISTRY[name]
    unknown = sorted(set(kwargs) - _parameters(factory) - CONTEXT_KEYS)
    if unknown:
        raise ConfigError(f"policy.{unknown[0]}", kwargs[unknown[0]],
                          f"not a parameter of policy {name}; it takes: "
                          f"{', '.join(sorted(_parameters(factory))) or 'none'}")
    router = factory(**kwargs)
    if ttft_slo_s is not None:
        from prfaas.policy.admission import AdmissionRouter

        router = AdmissionRouter(router, ttft_slo_s)
    return router


def router_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


PrefillCost = Callable[[InstanceLoad], tuple[float, int, str]]


def cheapest(query: RouteQuery, candidates: Sequence[InstanceLoad], cost: PrefillCost,
             fixed_s: float = 0.0, cached_tokens: int = 0) -> InstanceLoad:
    """`min(candidates, key=cost)`, where a candidate holding no prefix in `query` costs
    (queued_work_s + fixed_s) + prefill_time_s(input, `cached_tokens`), summed in that order.
    On a `RankedPool` (core/pool.py) only the prefix holders and the members whose lower bound
    of that cost is <= the best found are read: the same minimum, ties included."""
    if not isinstance(candidates, RankedPool):
        return min(candidates, key=cost)
    held = query.cached_tokens
    best: InstanceLoad | None = None
    best_key: tuple[float, int, str] | None = None
    for name in held:
        inst = candidates.get(name)
        if inst is not None:
            key = cost(inst)
            if best_key is None or key < best_key:
                best, best_key = inst, key
    floor_s = candidates.prefill_floor_s(query.request.input_tokens, cached_tokens)
    ranked = candidates.ranked(held)
    try:
        for bound_s, inst in ranked:
            if best_key is not None and bound_s + fixed_s + floor_s > best_key[0]:
                break  # float sums are monotone: no later member can cost <= the best
            key = cost(inst)
            if best_key is None or key < best_key:
                best, best_key = inst, key
    finally:
        ranked.close()
    if best is None:
        raise ValueError("cheapest() of an empty pool")
    return best


def pick_prefill(query: RouteQuery, view: ClusterView, candidates: Sequence[InstanceLoad]
                 ) -> tuple[InstanceLoad, int]:
    """The candidate with the smallest predicted TTFT contribution (queue + own service time,
    given its cached prefix); ties go to the longer cache, then the name. Returns it and its
    cached tokens."""
    req = query.request

    def cost(inst: InstanceLoad) -> tuple[float, int, str]:
        cached = min(query.cached_tokens.get(inst.instance_id, 0), req.input_tokens - 1)
        cached = max(cached, 0)
        service = view.prefill_time_s(inst.instance_id, req.input_tokens, cached)
        return (inst.queued_work_s + service, -cached, inst.instance_id)

    best = cheapest(query, candidates, cost)
    cached = max(min(query.cached_tokens.get(best.instance_id, 0), req.input_tokens - 1), 0)
    return best, cached


def remote_prefill(view: ClusterView) -> Sequence[InstanceLoad]:
    """The PrfaaS prefill instances a request can use: none while the link is down."""
    prf = view.instances(PRFAAS_CLUSTER, "prefill")
    return prf if prf and link_usable(view.link()) else ()


def route_pool(view: ClusterView, route: Route) -> Sequence[InstanceLoad]:
    """The prefill instances that can serve `route` now."""
    return remote_prefill(view) if route is Route.PRFAAS else view.instances(PD_CLUSTER,
                                                                             "prefill")


def no_prefill_reason(view: ClusterView) -> str:
    """Why no prefill instance can serve (for `RouteDecision.no_path`)."""
    remote = "no PrfaaS prefill instance up"
    if view.instances(PRFAAS_CLUSTER, "prefill"):
        remote = "the inter-cluster link is down"
    return f"no prefill instance can serve: no PD-P instance up and {remote}"


NO_DECODE = "no decode instance up"


def pick_decode(view: ClusterView) -> InstanceLoad | None:
    """The decode instance with the most free slots (then the fewest running, then name)."""
    decoders = view.instances(PD_CLUSTER, "decode")
    if not decoders:
        return None
    if isinstance(decoders, RankedPool):  # ranked in exactly this order
        return decoders.first()
    return min(decoders, key=lambda d: (-d.free_slots, d.running + d.queued_requests,
                                        d.instance_id))


def decide(query: RouteQuery, view: ClusterView, route: Route, threshold: int | None,
           fallback: bool = True) -> RouteDecision:
    """Place the prefill in the chosen route's cluster and pick a decode instance. With
    `fallback`, a route that cannot serve (its cluster down, or the link for PrfaaS) gives way
    to the other one (`reason` says so)."""
    candidates = route_pool(view, route)
    reason = ""
    if not candidates and fallback:
        other = Route.PD if route is Route.PRFAAS else Route.PRFAAS
        candidates = route_pool(view, other)
        if candidates:
            reason = f"{route.value} unavailable: fell back to {other.value}"
            route = other
    if not candidates:
        return RouteDecision.no_path(no_prefill_reason(view) if fallback else
                                     f"no {route.value} prefill instance can serve", threshold)
    inst, cached = pick_prefill(query, view, candidates)
    decoder = pick_decode(view)
    if decoder is None:
        return RouteDecision.no_path(NO_DECODE, threshold)
    return RouteDecision(
        route=route, prefill_instance=inst.instance_id, decode_instance=decoder.instance_id,
        cached_tokens=cached, uncached_tokens=query.request.input_tokens - cached,
        threshold_tokens=threshold, reason=reason,
    )
