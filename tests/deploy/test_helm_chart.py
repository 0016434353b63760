"""deploy/helm/prfaas rendered offline (helm-python-sdk: Helm's own Go engine, no cluster, no
binary) and strictly validated against the Kubernetes OpenAPI schemas (kubernetes-validate) of
several versions; then each role's placement, ports and env checked, and the ConfigMap's
topology parsed by prfaas itself. The monitoring objects: the PrometheusRule is the shipped
deploy/prometheus/prfaas-rules.yml (the same groups, checked by promtool), the dashboard
ConfigMap holds deploy/grafana/prfaas-dashboard.json, the PodMonitor labels what the rules
aggregate by. Negative controls: a misspelled field and a wrong type fail the same validation;
TLS without certificates fails the render; a chart whose rules drifted from the shipped file
fails the identity check."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from needs import check, import_for

helm = import_for("k8s", "helm_python.chart")
kv = import_for("k8s", "kubernetes_validate")
jsonschema = import_for("k8s", "jsonschema")
helm_errors = import_for("k8s", "helm_python.errors")

from prfaas.serve.topology import parse_topology  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "prfaas"
RULES = REPO / "deploy" / "prometheus" / "prfaas-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "prfaas-dashboard.json"
KUBE_VERSIONS = ("1.29.0", "1.33.0", "1.37.0")
CERTS = {"tls": {"files": {"ca.pem": "-----BEGIN CERTIFICATE-----\n..."}}}
# PodMonitor is a prometheus-operator CRD, outside kubernetes-validate's built-in schemas: the
# fields the chart uses, from the CRD's monitoring.coreos.com/v1 spec, unknown ones rejected
PODMONITOR_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["selector", "podMetricsEndpoints"], "properties": {
                     "selector": {"type": "object", "properties": {
                         "matchLabels": {"type": "object",
                                         "additionalProperties": {"type": "string"}}}},
                     "podMetricsEndpoints": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False, "properties": {
                             "port": {"type": "string"}, "path": {"type": "string"},
                             "interval": {"type": "string",
                                          "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?"
                                                     "(([0-9]+)s)?(([0-9]+)ms)?)$"},
                             "relabelings": {"type": "array", "items": {
                                 "type": "object", "additionalProperties": False,
                                 "properties": {
                                     "sourceLabels": {"type": "array", "items": {
                                         "type": "string",
                                         "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                                     "separator": {"type": "string"},
                                     "targetLabel": {"type": "string"},
                                     "regex": {"type": "string"},
                                     "replacement": {"type": "string"},
                                     "action": {"enum": ["replace", "keep", "drop",
                                                         "labelmap", "labeldrop",
                                                         "labelkeep"]}}}}}}}}}}}
DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                         "(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
# PrometheusRule, the fields of monitoring.coreos.com/v1's CRD the chart uses (unknown rejected)
PROMETHEUSRULE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "additionalProperties": False, "required": ["groups"],
                 "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "additionalProperties": False,
                     "required": ["name", "rules"], "properties": {
                         "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                         "rules": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False,
                             "required": ["expr"],
                             "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                             "properties": {
                                 "alert": {"type": "string"}, "record": {"type": "string"},
                                 "expr": {"type": "string", "minLength": 1}, "for": DURATION,
                                 "labels": {"type": "object",
                                            "additionalProperties": {"type": "string"}},
                                 "annotations": {"type": "object",
                                                 "additionalProperties": {"type": "string"}},
                             }}}}}}}}}}
SCHEMAS = {"PodMonitor": PODMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}


def render(values: dict[str, Any] | None = None, chart_dir: Path = CHART
           ) -> list[dict[str, Any]]:
    chart = helm.Chart.load(chart_dir)
    out = chart.render(values, name="demo", namespace="serving")
    docs = [d for text in out.values() for d in yaml.safe_load_all(text)]
    return [d for d in docs if d]


def validate(obj: dict[str, Any], version: str) -> None:
    if obj["kind"] in SCHEMAS:
        jsonschema.validate(obj, SCHEMAS[obj["kind"]])
    else:
        kv.validate(obj, version, strict=True)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_clean() -> None:
    report = helm.lint(str(CHART), CERTS, strict=True)
    assert report["errors"] == []
    assert all(m["severity"] < 2 for m in report["messages"]), report["messages"]


@pytest.mark.parametrize("values", [CERTS, {"tls": {"enabled": False}},
                                    {**CERTS, "podMonitor": {"enabled": False}}])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_validates_strictly(values: dict[str, Any], version: str) -> None:
    docs = render(values)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("StatefulSet") == 3 and kinds.count("Deployment") == 1
    assert kinds.count("ConfigMap") == 2 and kinds.count("PrometheusRule") == 1
    for obj in docs:
        validate(obj, version)


def test_validation_rejects_broken_objects() -> None:  # negative controls
    sts = by_kind(render(CERTS), "StatefulSet")[0]
    typo = yaml.safe_load(yaml.safe_dump(sts))
    typo["spec"]["template"]["spec"]["nodeSelektor"] = typo["spec"]["template"]["spec"].pop(
        "nodeSelector")
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, "1.33.0", strict=True)
    wrong = yaml.safe_load(yaml.safe_dump(sts))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong, "1.33.0", strict=True)
    monitor = by_kind(render(CERTS), "PodMonitor")[0]
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, PODMONITOR_SCHEMA)
    with pytest.raises(helm_errors.HelmRenderError, match=r"tls\.enabled needs"):
        render()


def topology_configmap(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "topology.yaml" in d["data"]]
    return cm


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    c: dict[str, Any] = container
    return c


def test_roles_placement_ports_env_and_topology() -> None:
    docs = render(CERTS)
    cm = topology_configmap(docs)
    topo = parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]))
    assert topo.link.rate_gbps is None and topo.intra_link.rate_gbps is None  # no emulation
    assert topo.security.tls_dir == "/etc/prfaas/tls"
    workers = {w.name: w for w in topo.workers}
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    dc_of_role = {"prfaas": "prfaas", "pd-p": "local", "pd-d": "local"}
    seen = set()
    for sts in by_kind(docs, "StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        role, dc = labels["prfaas.io/role"], labels["prfaas.io/dc"]
        assert dc == dc_of_role[role]
        assert sts["spec"]["template"]["spec"]["nodeSelector"] == {"prfaas.io/dc": dc}
        name = sts["metadata"]["name"]
        pods = [f"{name}-{i}" for i in range(sts["spec"]["replicas"])]
        c = _container(sts)
        assert c["command"][-2:] == ["--name", "$(POD_NAME)"]  # each pod is the worker of its name
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["PRFAAS_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        headless = services[sts["spec"]["serviceName"]]
        assert headless["spec"]["clusterIP"] == "None"
        for pod in pods:
            w = workers[pod]
            seen.add(pod)
            assert w.role == role and w.host == f"{pod}.{name}"
            assert ports["http"] == w.port
            assert ("kv" in ports) == (role == "pd-d")
            if role == "pd-d":
                assert ports["kv"] == w.kv_port
        assert {p["port"] for p in headless["spec"]["ports"]} == set(ports.values())
        probe = c["readinessProbe"]
        assert ("tcpSocket" in probe) == (role == "prfaas")  # mTLS: /health needs a cert
    assert seen == set(workers)
    (router,) = by_kind(docs, "Deployment")
    rc = _container(router)
    assert router["spec"]["template"]["spec"]["nodeSelector"] == {"prfaas.io/dc": "local"}
    assert rc["command"][-2:] == ["--name", "router"]
    assert {p["containerPort"] for p in rc["ports"]} == {topo.router_port}
    assert rc["readinessProbe"]["httpGet"]["path"] == "/health"
    assert services["demo-prfaas-router"]["spec"]["ports"][0]["targetPort"] == "http"
    (secret,) = by_kind(docs, "Secret")
    mounts = {m["name"]: m["mountPath"] for m in rc["volumeMounts"]}
    assert mounts["certs"] == "/etc/prfaas/tls" and "ca.pem" in secret["stringData"]


def test_scaled_values_add_pods_to_the_topology() -> None:
    values = {**CERTS, "datacenters": [
        {"name": "pf", "nodeSelector": {"zone": "a"},
         "roles": {"prfaas": {"replicas": 3, "port": 9001, "resources": {}}}},
        {"name": "pd", "nodeSelector": {"zone": "b"},
         "roles": {"pd-p": {"replicas": 1, "port": 9002, "resources": {}},
                   "pd-d": {"replicas": 2, "port": 9003, "kvPort": 9004, "resources": {}}}}],
        "router": {"datacenter": "pd", "port": 8000, "replicas": 1, "resources": {},
                   "service": {"type": "ClusterIP", "port": 80}}}
    docs = render(values)
    cm = topology_configmap(docs)
    topo = parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]))
    assert [len(topo.by_role(r)) for r in ("prfaas", "pd-p", "pd-d")] == [3, 1, 2]
    (router,) = by_kind(docs, "Deployment")
    assert router["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "b"}
    for obj in docs:
        validate(obj, "1.33.0")


def test_the_chart_carries_the_shipped_rules_and_dashboard(tmp_path: Path) -> None:
    docs = render(CERTS)
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # the same groups, not a copy
    (board,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith(
        "-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's label
    assert json.loads(board["data"]["prfaas-dashboard.json"]) == json.loads(
        DASHBOARD.read_text())
    check("prometheus")
    promtool = shutil.which("promtool")
    assert promtool is not None
    path = tmp_path / "rendered-rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]))  # Prometheus's own check of the rendered rules
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_chart_whose_rules_drifted_is_caught(tmp_path: Path) -> None:  # negative control
    chart = tmp_path / "prfaas"
    shutil.copytree(CHART, chart)  # the links become copies of their targets
    copy = chart / "files" / "prfaas-rules.yml"
    copy.write_text(copy.read_text().replace("for: 1m", "for: 5m", 1))
    (rule,) = by_kind(render(CERTS, chart), "PrometheusRule")
    assert rule["spec"] != yaml.safe_load(RULES.read_text())
    broken = yaml.safe_load(yaml.safe_dump(rule))
    broken["spec"]["groups"][1]["rules"][0]["for"] = "a minute"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUSRULE_SCHEMA)


def test_monitoring_objects_can_be_turned_off_and_labelled() -> None:
    off = render({**CERTS, "prometheusRule": {"enabled": False},
                  "grafanaDashboard": {"enabled": False}})
    assert not by_kind(off, "PrometheusRule") and len(by_kind(off, "ConfigMap")) == 1
    docs = render({**CERTS, "region": "eu-west", "prometheusRule": {
        "enabled": True, "labels": {"release": "kube-prometheus"}}})
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    (monitor,) = by_kind(docs, "PodMonitor")
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"targetLabel": "region", "replacement": "eu-west"} in relabel
    worker = next(r for r in relabel if r["targetLabel"] == "worker")
    assert worker["regex"] == "(prfaas|pd-p|pd-d);(.+)"  # the router pod gets no `worker`
