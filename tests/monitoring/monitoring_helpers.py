"""What the monitoring tests share: the shipped files, promtool, the metric names prfaas
exposes, and the metric names a PromQL expression reads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from needs import check
from prfaas.serve.gateway import _Metrics as GatewayMetrics
from prfaas.serve.router.metrics import RouterMetrics
from prfaas.serve.worker.worker_metrics import HELP, worker_metrics

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
RULES = PROM_DIR / "prfaas-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "prfaas-dashboard.json"


def promtool() -> str:
    check("prometheus")
    path = shutil.which("promtool")
    assert path is not None
    return path


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


def exposed_metric_names() -> set[str]:
    """Every metric the router, the workers and the PrfaaS gateway render (their `# TYPE`
    lines, written even before a series has a value; a histogram's three series)."""
    worker = worker_metrics({"http": 0}, 0,
                            gauges={n: 0 for n in HELP if not n.endswith("_total")},
                            counters={n: 0 for n in HELP if n.endswith("_total")}).text
    texts = [RouterMetrics().render(), GatewayMetrics().render(), worker or ""]
    names: set[str] = set()
    for text in texts:
        for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
            name, kind = m.groups()
            names |= ({f"{name}_bucket", f"{name}_sum", f"{name}_count"}
                      if kind == "histogram" else {name})
    return names


def recorded_names(rules: dict[str, Any]) -> set[str]:
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions,
    keywords, labels (in matchers, `by (...)`, `on (...)`...) or inside strings and ranges."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        if m.group(2) or m.group(1).lower() in _KEYWORDS:
            continue
        names.add(m.group(1))
    return names


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> list[str]:
    dash = dashboard or json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    """A dashboard query as Prometheus runs it: the variables Grafana would fill in."""
    return expr.replace("$__rate_interval", "1m").replace('"$region"', '".*"')
