"""TTFT-SLO admission control (Mooncake's early rejection), a wrapper around any router.

The inner router decides; the wrapper predicts that decision's TTFT on the chosen prefill
instance from the `ClusterView`:
    queue (queued_work_s) + prefix move (kv_transfer_s of prefix_transfer_tokens, if any)
    + prefill (prefill_time_s of the uncached part) + KV to the decoder,
where the KV leg of a PrfaaS prefill (kv_transfer_s of the input) overlaps the prefill when
`pipelined` (layer-wise streaming: the later of the two ends counts) and adds to it otherwise;
a PD-P prefill's intra-cluster KV leg is taken as free. If the prediction exceeds
`ttft_slo_s` the request is rejected (`RouteDecision.reject`, HTTP 429 in the live system).
The wrapper counts its own rejections (`rejected`), but every caller must also count rejected
decisions it receives: nothing is dropped silently.
"""

from __future__ import annotations

from prfaas.core.errors import ConfigError
from prfaas.core.pool import RankedPool
from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    ClusterView,
    Route,
    RouteDecision,
    RouteQuery,
)
from prfaas.policy.base import Router


def _queued_work_s(view: ClusterView, instance_id: str) -> float:
    """The instance's queued work (0.0 if the view no longer shows it): looked up by name in
    ranked pools, else found by a scan."""
    pools = [view.instances(c, "prefill") for c in (PRFAAS_CLUSTER, PD_CLUSTER)]
    if all(isinstance(p, RankedPool) for p in pools):
        for pool in pools:
            assert isinstance(pool, RankedPool)
            inst = pool.get(instance_id)
            if inst is not None:
                return inst.queued_work_s
        return 0.0
    return next((i.queued_work_s for i in view.instances()
                 if i.instance_id == instance_id), 0.0)


def predict_ttft_s(decision: RouteDecision, query: RouteQuery, view: ClusterView,
                   pipelined: bool = True) -> float:
    """Predicted TTFT of an accepted decision (see module docstring)."""
    queue_s = _queued_work_s(view, decision.prefill_instance)
    move_s = view.kv_transfer_s(decision.prefix_transfer_tokens) \
        if decision.prefix_transfer_tokens > 0 else 0.0
    prefill_s = view.prefill_time_s(decision.prefill_instance, query.request.input_tokens,
                                    decision.cached_tokens)
    service_s = prefill_s
    if decision.route is Route.PRFAAS:
        kv_s = view.kv_transfer_s(query.request.input_tokens)
        service_s = max(prefill_s, kv_s) if pipelined else prefill_s + kv_s
    return queue_s + move_s + service_s


class AdmissionRouter(Router):
    def __init__(self, inner: Router, ttft_slo_s: float, pipelined: bool = True) -> None:
        if not ttft_slo_s > 0:
            raise ConfigError("ttft_slo_s", ttft_slo_s, "must be positive")
        self.inner = inner
        self.ttft_slo_s = float(ttft_slo_s)
        self.pipelined = pipelined
        self.name = f"{inner.name}+slo"
        self.rejected = 0

    def threshold_tokens(self) -> int | None:
        return self.inner.threshold_tokens()

    def threshold_limits_tokens(self) -> tuple[int, int] | None:
        return self.inner.threshold_limits_tokens()

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        decision = self.inner.route(query, view)
        if decision.rejected:
            return decision
        ttft_s = predict_ttft_s(decision, query, view, self.pipelined)
        if ttft_s <= self.ttft_slo_s:
            return decision
        self.rejected += 1
        return RouteDecision.reject(
            f"predicted TTFT {ttft_s:.2f} s > SLO {self.ttft_slo_s:.2f} s",
            decision.threshold_tokens)
