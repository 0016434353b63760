"""The shipped Prometheus rules (deploy/prometheus/): promtool's own unit tests pass, every
alert has a case where it fires and one where it must not, the tests fail when a rule is
weakened or loosened (negative controls), every expression reads only metrics prfaas exposes,
the shipped targets match the embedded topology, and the live drill's time scaling changes
durations and nothing else."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from monitoring_helpers import (
    PROM_DIR,
    RULES,
    exposed_metric_names,
    metric_names,
    recorded_names,
    run_promtool,
)

from prfaas.experiments.prometheus import duration_s, scaled_rules
from prfaas.serve.deploy.scrape import scrape_targets
from prfaas.serve.topology import load_topology


def _rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_unit_tests_pass() -> None:
    done = run_promtool("test", "rules", "rules_test.yml", cwd=PROM_DIR)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_promtool_checks_the_rules_and_the_config() -> None:
    rules = run_promtool("check", "rules", str(RULES))
    assert rules.returncode == 0 and f"{len(_rules())} rules found" in rules.stdout, rules.stdout
    config = run_promtool("check", "config", "prometheus.yml", cwd=PROM_DIR)
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    tests = yaml.safe_load((PROM_DIR / "rules_test.yml").read_text())["tests"]
    checks = [c for t in tests for c in t.get("alert_rule_test", [])]
    exprs = " ".join(c["expr"] for t in tests for c in t.get("promql_expr_test", []))
    alert_exprs = " ".join(str(r["expr"]) for r in _rules() if "alert" in r)
    for rule in _rules():
        if "alert" in rule:
            mine = [c for c in checks if c["alertname"] == rule["alert"]]
            assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: never fires"
            assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no silent case"
        else:  # a recording rule: its value checked, or read by a tested alert
            assert rule["record"] in exprs or rule["record"] in alert_exprs, rule["record"]


MUTATIONS = [  # (what is weakened, text in the rules, its replacement)
    ("link down alerts at once", "expr: prfaas_link_up == 0\n        for: 1m",
     "expr: prfaas_link_up == 0\n        for: 0m"),
    ("a steady queue counts as growing",
     "prfaas_inflight_requests > 8 and deriv(prfaas_inflight_requests[10m]) > 0.01",
     "prfaas_inflight_requests > 8"),
    ("offload judged on a trickle of requests", "[10m])) > 0.1\n", "[10m])) > 0\n"),
    ("a scrape target of any job", 'up{job=~".*prfaas.*"} == 0', "up == 0"),
    ("budget without its 10% margin", "prfaas_destination_egress_budget_gbps) * 1.1)",
     "prfaas_destination_egress_budget_gbps) * 1.0)"),
    ("egress at 85% of the link counts as saturated", "> 0.9 * prfaas_link_capacity_gbps",
     "> 0.8 * prfaas_link_capacity_gbps"),
]


@pytest.mark.parametrize(("what", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_weakened_rule_fails_its_tests(what: str, old: str, new: str, tmp_path: Path) -> None:
    text = RULES.read_text()
    assert text.count(old) == 1, f"mutation target not found once: {old!r}"
    (tmp_path / "prfaas-rules.yml").write_text(text.replace(old, new))
    shutil.copy(PROM_DIR / "rules_test.yml", tmp_path)
    done = run_promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, f"{what}: passes"


def test_rules_read_only_metrics_prfaas_exposes() -> None:
    rules = yaml.safe_load(RULES.read_text())
    known = exposed_metric_names() | recorded_names(rules) | {"up"}
    for rule in _rules():
        unknown = metric_names(str(rule["expr"])) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: {unknown}"
    # the parser finds a misspelled metric and skips functions, labels, keywords and numbers
    expr = ('sum by (le) (rate(prfaas_ttft_secnds_bucket{route="pd"}[5m])) * 8 / 1e9 '
            '> on (region) group_left max(prfaas_link_up) and up')
    assert metric_names(expr) == {"prfaas_ttft_secnds_bucket", "prfaas_link_up", "up"}
    assert metric_names(expr) - known == {"prfaas_ttft_secnds_bucket"}


def test_shipped_targets_are_the_embedded_topology() -> None:
    shipped = json.loads((PROM_DIR / "targets" / "local.json").read_text())
    assert shipped == scrape_targets(load_topology())  # regenerate: python -m ...scrape
    by_worker = {g["labels"].get("worker"): g for g in shipped}
    assert by_worker[None]["labels"] == {"component": "router", "region": "local"}
    assert by_worker["prfaas-0"]["labels"]["role"] == "prfaas"


def test_scaling_changes_durations_and_nothing_else() -> None:
    text = RULES.read_text()
    shipped = yaml.safe_load(text)
    fast = scaled_rules(text, 1 / 30)
    strip = re.compile(r"\[[^\]]*\]")
    for g_ship, g_fast in zip(shipped["groups"], fast["groups"], strict=True):
        for r_ship, r_fast in zip(g_ship["rules"], g_fast["rules"], strict=True):
            assert strip.sub("[]", r_ship["expr"]) == strip.sub("[]", r_fast["expr"])
            ship_ranges = [duration_s(x) for x in re.findall(r"\[([^\]:]+)\]", r_ship["expr"])]
            fast_ranges = [duration_s(x) for x in re.findall(r"\[([^\]:]+)\]", r_fast["expr"])]
            assert fast_ranges == pytest.approx([x / 30 for x in ship_ranges])
            if "for" in r_ship:
                assert duration_s(r_fast["for"]) == pytest.approx(duration_s(r_ship["for"]) / 30)
            rest = {k: v for k, v in r_ship.items() if k not in ("expr", "for")}
            assert rest == {k: v for k, v in r_fast.items() if k not in ("expr", "for")}
    link_down = next(r for g in fast["groups"] for r in g["rules"]
                     if r.get("alert") == "PrfaasLinkDown")
    assert link_down["for"] == "2000ms"
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        duration_s("5 minutes")


def test_scaled_rules_still_load(tmp_path: Path) -> None:
    path = tmp_path / "fast.yml"
    path.write_text(yaml.safe_dump(scaled_rules(RULES.read_text(), 1 / 30)))
    done = run_promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
