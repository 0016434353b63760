"""The alert rules against a live deployment: Debian's `prometheus` (its own free port and
temporary data folder, stopped by pid) scrapes the embedded local.yaml deployment with its
inter-DC link in a network namespace; the link is cut, then the PD-P worker is killed, and
the matching alerts must fire, only they, and resolve (experiments/alert_drill.py). The
shipped rules run with every duration / 30 (`for: 1m` -> 2 s): the same expressions and
thresholds on a clock a test can wait for; test_rules.py checks the shipped timing itself.
Every dashboard query also runs on the live server: it must be accepted, and those over
the router's series must return data. Needs the prometheus binary, root and iproute2.
PRFAAS_ALERT_DRILL_OUT=FILE records the run (benchmarks/bench_alert_drill.py's JSON)."""

from __future__ import annotations

import os

import pytest
from monitoring_helpers import RULES, dashboard_queries, grafana_to_promql

from needs import needs
from prfaas.experiments.alert_drill import EXPECTED, record, run_drill, verdict

pytestmark = [pytest.mark.timeout(400), needs("prometheus", "netns")]

ROUTER_SERIES = ("prfaas_requests_total", "prfaas_threshold_tokens", "prfaas_link_planned_gbps",
                 "prfaas_inflight_requests", "region:prfaas_ttft_seconds:p90_5m")


def test_link_cut_and_worker_kill_fire_their_alerts_and_resolve() -> None:
    queries = tuple(grafana_to_promql(q) for q in dashboard_queries())
    result = run_drill(RULES.read_text(), queries=queries)
    if os.environ.get("PRFAAS_ALERT_DRILL_OUT"):  # benchmarks/results/alert_drill.json
        record(result, os.environ["PRFAAS_ALERT_DRILL_OUT"])
    problems = verdict(result)
    assert not problems, "\n".join(problems) + f"\n{result}"
    phases = {p["phase"]: p for p in result["phases"]}
    for name, expected in EXPECTED.items():
        names = {a["alertname"] for a in phases[name]["alerts"] if a["firing_s"] is not None}
        assert {alertname for alertname, _ in expected} <= names
    assert "PrfaasLinkDown" not in {a["alertname"] for a in phases["worker-kill"]["alerts"]}
    for query, series in result["queries"].items():
        if any(name in query for name in ROUTER_SERIES):
            assert series > 0, f"no data for the dashboard's {query}"
