"""The router's Prometheus metrics, rendered in the text exposition format (no client library).

Histograms: TTFT, TPOT, end-to-end latency and the router's own time per request. Counters:
requests by route and outcome, KV bytes by link, retries, resumes, failed attempts by route,
HTTP errors by status, worker restarts. Gauges: worker up (per worker), degraded, active
requests; the policy's current threshold and, for a controlled t, the range it can move in;
in-flight requests per worker (queue depths); the inter-DC link: reachable or not, its
capacity as the router knows it, the planned rate, measured egress and pending KV bytes (what
the threshold controller reads); the planned offload fraction. The planned figures are what
the topology's `plan:` says (serve/planned.py), so the alert rules in deploy/prometheus/ can
compare the live figures with them. docs/operate.md lists every metric and alert.
"""

from __future__ import annotations

from collections.abc import Callable

from prfaas.serve.prom import Counter, Histogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25)


class RouterMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram("prfaas_ttft_seconds", "Time to first token.", LATENCY_BUCKETS_S)
        self.tpot = Histogram("prfaas_tpot_seconds", "Time per output token after the first.",
                              LATENCY_BUCKETS_S)
        self.e2e = Histogram("prfaas_request_seconds", "End-to-end request latency.",
                             LATENCY_BUCKETS_S)
        self.router_time = Histogram("prfaas_router_overhead_seconds",
                                     "Router CPU time per request (parse, tokenize, hash, "
                                     "route, format), excluding waits on workers.",
                                     FAST_BUCKETS_S)
        self.requests = Counter("prfaas_requests_total", "Requests by route and outcome.")
        self.kv_bytes = Counter("prfaas_kv_bytes_total", "KV bytes shipped, by link.")
        self.kv_wire_bytes = Counter("prfaas_kv_wire_bytes_total",
                                     "KV bytes as they crossed the link (less where "
                                     "link.compression compressed them; a worker that does not "
                                     "report them: its KV bytes), by link.")
        self.kv_transfers = Counter("prfaas_kv_transfers_total",
                                    "Prompt KV transfers (one per prefill that shipped; an "
                                    "n > 1 request is one), by link.")
        self.cached_tokens = Counter("prfaas_cached_tokens_total",
                                     "Prompt tokens served from a prefill node's prefix cache.")
        self.retries = Counter("prfaas_retries_total", "Requests retried on the local path.")
        self.failures = Counter("prfaas_attempt_failures_total",
                                "Attempts that failed (a KV transfer broken or late, a worker "
                                "gone during the attempt), by the route they were on.")
        self.errors = Counter("prfaas_http_errors_total", "Error replies by HTTP status.")
        self.threshold = Counter("prfaas_threshold_tokens", "Length threshold t in force.",
                                 "gauge")
        self.threshold_limits = Counter(
            "prfaas_threshold_limit_tokens", "The range a controlled t can move in now: low = "
            "everything offloaded, high = nothing offloaded (absent for a fixed t).", "gauge")
        self.inflight = Counter("prfaas_inflight_requests",
                                "Requests in flight per worker (queue depth).", "gauge")
        self.link_egress = Counter("prfaas_link_egress_gbps",
                                   "Measured PrfaaS -> PD KV egress (sliding window).", "gauge")
        self.link_up = Counter("prfaas_link_up", "1 while the router reaches a PrfaaS worker "
                               "(0: the inter-DC link or the whole PrfaaS side is down).",
                               "gauge")
        self.link_capacity = Counter("prfaas_link_capacity_gbps",
                                     "The inter-DC link's capacity as the router knows it "
                                     "(link telemetry, else the emulated link.rate_gbps; absent "
                                     "when neither is known).", "gauge")
        self.link_planned = Counter("prfaas_link_planned_gbps",
                                    "The inter-DC link rate the deployment was planned for "
                                    "(plan.link_gbps, else link.rate_gbps).", "gauge")
        self.plan_offload = Counter("prfaas_plan_offload_fraction",
                                    "The share of requests the plan offloads to PrfaaS "
                                    "(plan.offload_fraction).", "gauge")
        self.link_pending = Counter("prfaas_link_pending_bytes",
                                    "Predicted KV bytes of PrfaaS requests not yet delivered.",
                                    "gauge")
        self.resumes = Counter("prfaas_resumes_total", "Requests resumed on another path after "
                               "tokens were sent (re-prefill of prompt + emitted tokens).")
        self.worker_up = Counter("prfaas_worker_up", "1 while the router holds the worker up.",
                                 "gauge")
        self.restarts = Counter("prfaas_worker_restarts_total",
                                "Worker restarts the router saw (a new pid in /health).")
        self.degraded = Counter("prfaas_degraded", "1 while any worker is down.", "gauge")
        self.active = Counter("prfaas_active_requests", "Requests accepted and not finished.",
                              "gauge")
        self.cache_events = Counter("prfaas_cache_events_total",
                                    "The instances' own KV cache events (vLLM kv_events) by "
                                    "worker and kind: blocks stored / removed, clears, index "
                                    "resets (events lost), blocks that could not be placed.",
                                    "counter")
        self.worker_role = Counter("prfaas_worker_role", "1 for the role each worker serves "
                                   "in now (prfaas, pd-p, pd-d): role changes show here.",
                                   "gauge")
        self.shape_decisions = Counter("prfaas_shape_decisions_total",
                                       "The shape controller's decisions by outcome: "
                                       "proposed, requested, completed, failed, refused_KIND "
                                       "(empty_role, flap, busy, unknown, same_role, cost).",
                                       "counter")
        self.shape_draining = Counter("prfaas_shape_draining", "1 while a PD worker is out "
                                      "of routing for a role change (draining to switching).",
                                      "gauge")

        # series exist from the start, at 0 (a ratio of rates over a missing series would be
        # missing, not 0: an alert on "no request offloaded" could never fire)
        for route in ("prfaas", "pd"):
            for outcome in ("ok", "error"):
                self.requests.inc(0.0, route=route, outcome=outcome)
            self.failures.inc(0.0, route=route)
        for counter in (self.retries, self.resumes):
            counter.inc(0.0)

    def render(self, refresh: Callable[[], None] | None = None) -> str:
        if refresh is not None:
            refresh()
        parts: list[Histogram | Counter] = [
            self.ttft, self.tpot, self.e2e, self.router_time, self.requests, self.kv_bytes,
            self.kv_wire_bytes, self.kv_transfers, self.cached_tokens, self.retries,
            self.failures, self.errors, self.threshold, self.threshold_limits, self.inflight,
            self.link_up, self.link_capacity, self.link_planned, self.plan_offload,
            self.link_egress, self.link_pending, self.resumes, self.worker_up, self.restarts,
            self.degraded, self.active, self.cache_events, self.worker_role,
            self.shape_decisions, self.shape_draining]
        return "\n".join(line for p in parts for line in p.render()) + "\n"
