"""Routers whose t is driven by the short-term `ThresholdController`.

`cache-aware+controller` wraps `cache-aware`; `prfaas-threshold+controller` wraps the static
rule. On every request the wrapper first lets the controller update t (it re-solves on its own
period, reading only `view`), routes with the inner router, then feeds the controller the
request's post-prefix-match length: input minus the longest prefix cached on any prefill
instance. Factory arguments: `threshold_tokens` (the initial t), `plan_inputs` (a
`PlanInputs` with the profiles; its lengths and link are replaced by live estimates), an
optional `controller` (`ControllerConfig` or a dict of its fields), and the inner router's own
keyword arguments.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from prfaas.core.errors import ConfigError
from prfaas.core.types import ClusterView, RouteDecision, RouteQuery
from prfaas.planner.search import PlanInputs
from prfaas.policy.base import Router, register
from prfaas.policy.cache_aware import CacheAwareRouter
from prfaas.policy.controller import ControllerConfig, ThresholdController
from prfaas.policy.threshold import ThresholdRouter


@runtime_checkable
class Tunable(Protocol):
    """A router whose t can be set from outside."""

    def set_threshold_tokens(self, threshold_tokens: int) -> None: ...


class ControlledRouter(Router):
    def __init__(self, inner: Router, controller: ThresholdController) -> None:
        if not isinstance(inner, Tunable):
            raise ConfigError("inner", inner.name, "router has no adjustable threshold")
        self.inner = inner
        self._tunable: Tunable = inner
        self.controller = controller
        self.name = f"{inner.name}+controller"

    def threshold_tokens(self) -> int | None:
        return self.controller.t_tokens

    def threshold_limits_tokens(self) -> tuple[int, int] | None:
        return self.controller.limits_tokens()

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        t = self.controller.update(view)
        self._tunable.set_threshold_tokens(t)
        decision = self.inner.route(query, view)
        best = max(query.cached_tokens.values(), default=0)
        uncached = query.request.input_tokens - min(best, query.request.input_tokens)
        self.controller.observe(uncached, view.now_s)
        return decision


def _controller(threshold_tokens: int, plan_inputs: PlanInputs | None,
                controller: ControllerConfig | dict[str, Any] | None) -> ThresholdController:
    if plan_inputs is None:
        raise ConfigError("plan_inputs", None, "a controlled router needs the planner inputs")
    if isinstance(controller, dict):
        try:
            controller = ControllerConfig(**controller)
        except TypeError as exc:
            raise ConfigError("controller", controller, str(exc)) from exc
    return ThresholdController(plan_inputs, threshold_tokens, controller)


@register("cache-aware+controller")
def cache_aware_controlled(threshold_tokens: int, plan_inputs: PlanInputs | None = None,
                           controller: ControllerConfig | dict[str, Any] | None = None,
                           **kwargs: Any) -> Router:
    return ControlledRouter(CacheAwareRouter(threshold_tokens, **kwargs),
                            _controller(threshold_tokens, plan_inputs, controller))


cache_aware_controlled.forwards = CacheAwareRouter  # type: ignore[attr-defined]


@register("prfaas-threshold+controller")
def threshold_controlled(threshold_tokens: int, plan_inputs: PlanInputs | None = None,
                         controller: ControllerConfig | dict[str, Any] | None = None,
                         **_: Any) -> Router:
    return ControlledRouter(ThresholdRouter(threshold_tokens),
                            _controller(threshold_tokens, plan_inputs, controller))
