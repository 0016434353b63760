"""Length-threshold routers: the paper's static rule and the two baselines' trivial rules.

- `prfaas-threshold`: prefill on PrfaaS iff the uncached length (input minus the longest prefix
  cached in the PD cluster) exceeds t, else on a PD-P instance.
- `all-pd`: every prefill local (homogeneous PD).
- `all-prfaas`: every prefill on the PrfaaS cluster (naive heterogeneous).
"""

from __future__ import annotations

from prfaas.core.errors import ConfigError
from prfaas.core.types import PD_CLUSTER, ClusterView, Route, RouteDecision, RouteQuery, best_cached
from prfaas.policy.base import Router, decide, register


@register("prfaas-threshold")
class ThresholdRouter(Router):
    name = "prfaas-threshold"

    def __init__(self, threshold_tokens: int, **_: object) -> None:
        if threshold_tokens < 0:
            raise ConfigError("threshold_tokens", threshold_tokens, "must be >= 0")
        self._t = int(threshold_tokens)

    def threshold_tokens(self) -> int | None:
        return self._t

    def set_threshold_tokens(self, threshold_tokens: int) -> None:
        """Used by the threshold controller."""
        self._t = max(int(threshold_tokens), 0)

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        local_cached = best_cached(query, view.instances(PD_CLUSTER, "prefill")) \
            if query.cached_tokens else 0  # (best_cached of no prefix, without the lookup)
        uncached = query.request.input_tokens - local_cached
        route = Route.PRFAAS if uncached > self._t else Route.PD
        return decide(query, view, route, self._t)


@register("all-pd")
class AllLocalRouter(Router):
    name = "all-pd"

    def __init__(self, **_: object) -> None:
        pass

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        return decide(query, view, Route.PD, None)


@register("all-prfaas")
class AllRemoteRouter(Router):
    name = "all-prfaas"

    def __init__(self, **_: object) -> None:
        pass

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        return decide(query, view, Route.PRFAAS, None)
