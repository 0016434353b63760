"""The Grafana dashboard (deploy/grafana/prfaas-dashboard.json): well formed, showing what an
operator needs (routes, t, the link against its plan, TTFT, queues, per-region figures), every
query reading only metrics prfaas exposes or the rules record, and every query parsed by
Prometheus's own parser (promtool). Negative controls: a misspelled metric and a broken query
are caught."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_helpers import (
    DASHBOARD,
    RULES,
    dashboard_queries,
    exposed_metric_names,
    grafana_to_promql,
    metric_names,
    recorded_names,
    run_promtool,
)

NEEDED = {  # what the dashboard must show -> a metric one of its queries reads
    "routes": "prfaas_requests_total",
    "threshold t": "prfaas_threshold_tokens",
    "link rate": "prfaas_link_egress_gbps",
    "planned link rate": "prfaas_link_planned_gbps",
    "TTFT": "region:prfaas_ttft_seconds:p90_5m",
    "queues": "prfaas_inflight_requests",
    "per-region egress budget": "prfaas_destination_egress_budget_gbps",
    "offload against plan": "prfaas_plan_offload_fraction",
}


def _dashboard() -> dict[str, Any]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dash


def _unknown_metrics(dash: dict[str, Any]) -> set[str]:
    known = exposed_metric_names() | recorded_names(yaml.safe_load(RULES.read_text()))
    return {n for q in dashboard_queries(dash) for n in metric_names(q)} - known


def test_panels_are_well_formed() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "region"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_the_dashboard_shows_what_operators_need() -> None:
    read = {n for q in dashboard_queries(_dashboard()) for n in metric_names(q)}
    missing = {what: name for what, name in NEEDED.items() if name not in read}
    assert not missing


def test_queries_read_only_metrics_that_exist() -> None:
    dash = _dashboard()
    assert _unknown_metrics(dash) == set()
    typo = copy.deepcopy(dash)  # negative control
    target = next(p for p in typo["panels"] if p["type"] != "row")["targets"][0]
    target["expr"] = target["expr"].replace("prfaas_requests_total", "prfaas_request_total")
    assert _unknown_metrics(typo) == {"prfaas_request_total"}


def _parse_all(queries: list[str], folder: Path) -> tuple[int, str]:
    """promtool's check of `queries` as recording rules (Prometheus's own PromQL parser)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(q)}
        for i, q in enumerate(queries)]}]}
    path = folder / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    done = run_promtool("check", "rules", str(path))
    return done.returncode, done.stdout + done.stderr


def test_every_query_parses(tmp_path: Path) -> None:
    queries = dashboard_queries(_dashboard())
    rc, out = _parse_all(queries, tmp_path)
    assert rc == 0, out
    rc, out = _parse_all([*queries, "sum by (region (rate(prfaas_requests_total[1m]))"],
                         tmp_path)
    assert rc != 0 and "dashboard:query_" in out  # a broken query is caught


@pytest.mark.parametrize("query", ['rate(prfaas_requests_total{region=~"$region"}'
                                   '[$__rate_interval])'])
def test_grafana_variables_become_promql(query: str) -> None:
    assert grafana_to_promql(query) == 'rate(prfaas_requests_total{region=~".*"}[1m])'
