"""deploy/helm/prfaas rendered offline (helm-python-sdk: Helm's own Go engine, no cluster, no
binary) and strictly validated against the Kubernetes OpenAPI schemas (kubernetes-validate) of
several versions; then each role's placement, ports and env checked, and the ConfigMap's
topology parsed by prfaas itself. Negative controls: a misspelled field and a wrong type fail
the same validation; TLS without certificates fails the render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from needs import import_for

helm = import_for("k8s", "helm_python.chart")
kv = import_for("k8s", "kubernetes_validate")
jsonschema = import_for("k8s", "jsonschema")
helm_errors = import_for("k8s", "helm_python.errors")

from prfaas.serve.topology import parse_topology  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "prfaas"
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
                                                     "(([0-9]+)s)?(([0-9]+)ms)?)$"}}}}}}}}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name="demo", namespace="serving")
    docs = [d for text in out.values() for d in yaml.safe_load_all(text)]
    return [d for d in docs if d]


def validate(obj: dict[str, Any], version: str) -> None:
    if obj["kind"] == "PodMonitor":
        jsonschema.validate(obj, PODMONITOR_SCHEMA)
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
    assert "ConfigMap" in kinds
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


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    c: dict[str, Any] = container
    return c


def test_roles_placement_ports_env_and_topology() -> None:
    docs = render(CERTS)
    (cm,) = by_kind(docs, "ConfigMap")
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
    (cm,) = by_kind(docs, "ConfigMap")
    topo = parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]))
    assert [len(topo.by_role(r)) for r in ("prfaas", "pd-p", "pd-d")] == [3, 1, 2]
    (router,) = by_kind(docs, "Deployment")
    assert router["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "b"}
    for obj in docs:
        validate(obj, "1.33.0")
