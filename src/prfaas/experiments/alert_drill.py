"""Alert drill: a live deployment, a real Prometheus with the shipped rules, two faults, and
which alerts fired for each and when they resolved.

The deployment is the embedded `local.yaml` (one PrfaaS, one PD-P, one PD-D worker, the native
engine) on free ports, with its inter-DC link in a network namespace (`link.emulation: netns`,
so the link can really be cut), health checks every 0.3 s (down after 2 failures) and a
restart backoff of `restart_backoff_s` (how long a killed worker stays dead). Prometheus
(experiments/prometheus.py) scrapes the router and the three workers (serve/deploy/scrape.py)
and evaluates the shipped rules with every duration times `factor` (`for: 1m` -> 2 s at
1/30): the conditions are the shipped ones, on a clock fast enough for a test.

Phases, each recording every alert Prometheus reports active (first seen pending, first seen
firing, gone) in seconds from the phase's start:
1. `healthy`: a few requests on both routes, then `baseline_s` of quiet running;
2. `partition`: the namespace's veth goes down until the expected alert fired and
   `hold_after_s` more, then comes back up; the phase ends when no alert is active;
3. `worker-kill`: SIGKILL to the PD-P worker (the supervisor restarts it after the backoff);
   the phase ends when no alert is active and the worker is up again.
`queries` (e.g. the dashboard's) are evaluated on the live server before it stops.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prfaas.core.errors import PrfaasError
from prfaas.experiments.prometheus import PrometheusServer, scaled_rules
from prfaas.integrations.vllm.reference import post_completion
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.deploy.scrape import scrape_targets
from prfaas.serve.resilience import HealthSpec, RestartSpec
from prfaas.serve.topology import LinkSpec, Topology, load_topology

POLL_S = 0.25
# the router's checks: a dead worker is down within about 1 s (refused twice), a cut link
# within about 5 s (two 2 s timeouts), and a check slowed by a loaded host is not a fault
HEALTH = HealthSpec(interval_s=0.3, timeout_s=2.0, failures_before_down=2, successes_before_up=2)
# what each fault must raise (alertname, the `worker` label when the alert has one)
EXPECTED: dict[str, set[tuple[str, str | None]]] = {
    "partition": {("PrfaasLinkDown", None)},
    "worker-kill": {("PrfaasWorkerDown", "pdp-0")}}
FAULTED = {"partition": "prfaas-0", "worker-kill": "pdp-0"}  # the component each fault hits


@dataclass
class Seen:
    """One alert (name and identifying labels) over one phase, in s from the phase's start."""

    alertname: str
    labels: dict[str, str]
    pending_s: float
    firing_s: float | None = None
    resolved_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"alertname": self.alertname, "labels": self.labels,
                "pending_s": round(self.pending_s, 2),
                "firing_s": None if self.firing_s is None else round(self.firing_s, 2),
                "resolved_s": None if self.resolved_s is None else round(self.resolved_s, 2)}


@dataclass
class Phase:
    name: str
    t0: float = field(default_factory=time.monotonic)
    seen: dict[str, Seen] = field(default_factory=dict)
    fault_end_s: float | None = None  # when the fault was undone or the worker back up
    events: list[str] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def observe(self, alerts: list[dict[str, Any]]) -> None:
        now, active = self.now(), set()
        for a in alerts:
            labels = {k: v for k, v in a["labels"].items()
                      if k in ("worker", "instance", "region", "route", "severity")}
            key = a["labels"]["alertname"] + json.dumps(labels, sort_keys=True)
            active.add(key)
            s = self.seen.setdefault(key, Seen(a["labels"]["alertname"], labels, now))
            if a["state"] == "firing" and s.firing_s is None:
                s.firing_s = now
            s.resolved_s = None  # (active again)
        for key, s in self.seen.items():
            if key not in active and s.resolved_s is None:
                s.resolved_s = now

    def fired(self, alertname: str, worker: str | None) -> bool:
        return any(s.alertname == alertname and s.firing_s is not None
                   and (worker is None or s.labels.get("worker") == worker)
                   for s in self.seen.values())

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.name, "fault_end_s": None if self.fault_end_s is None
                else round(self.fault_end_s, 2), "duration_s": round(self.now(), 2),
                "events": self.events,
                "alerts": [s.to_json() for s in sorted(self.seen.values(),
                                                        key=lambda s: s.pending_s)]}


def drill_topology(restart_backoff_s: float) -> Topology:
    """`local.yaml` on free ports, its link in a namespace, fast health checks, slow restarts."""
    base = load_topology()
    workers = tuple(replace(w, port=0, kv_port=0) for w in base.workers)
    link = LinkSpec(base.link.rate_gbps, base.link.connections, "netns")
    return replace(base, workers=workers, router_port=0, link=link,
                   health=HEALTH,
                   restart=RestartSpec(initial_backoff_s=restart_backoff_s,
                                       max_backoff_s=restart_backoff_s))


def _complete(url: str, model: str, prompt: str) -> dict[str, Any]:
    status, reply = post_completion(url, {"model": model, "prompt": prompt, "max_tokens": 4,
                                          "temperature": 0}, timeout_s=300)
    if status != 200:
        raise PrfaasError(f"the router answered HTTP {status}: {str(reply)[:300]}")
    return reply


def _watch(prom: PrometheusServer, phase: Phase, until: Callable[[list[dict[str, Any]]], bool],
           limit_s: float) -> bool:
    """Poll the alerts into `phase` until `until(the alerts just observed)` (True) or `limit_s`
    (False). `until` judges the same answer the phase recorded: a second query could see an
    alert resolve that the phase never saw resolve."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alerts = prom.alerts()
        phase.observe(alerts)
        if until(alerts):
            return True
        time.sleep(POLL_S)
    return False


def _all_up(dep: Deployment) -> bool:
    with urllib.request.urlopen(f"{dep.url}/health", timeout=10) as resp:
        members = json.load(resp)["members"]
    return all(m["up"] for m in members.values())


def run_drill(rules_text: str, factor: float = 1 / 30, baseline_s: float = 6.0,
              hold_after_s: float = 3.0, restart_backoff_s: float = 8.0,
              fault_limit_s: float = 60.0, queries: tuple[str, ...] = (),
              log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    t_start = time.monotonic()
    topology = drill_topology(restart_backoff_s)
    out: dict[str, Any] = {"factor": factor, "scrape_interval_s": 1.0, "eval_interval_s": 0.5,
                           "restart_backoff_s": restart_backoff_s,
                           "health": {"interval_s": HEALTH.interval_s,
                                      "timeout_s": HEALTH.timeout_s,
                                      "failures_before_down": HEALTH.failures_before_down},
                           "phases": []}
    with Deployment(topology) as dep:
        assert dep.netns is not None  # link.emulation: netns
        targets = scrape_targets(dep.topology, region="local")
        with PrometheusServer(targets, scaled_rules(rules_text, factor)) as prom:
            out["startup_s"] = round(time.monotonic() - t_start, 1)
            log(f"deployment and prometheus up in {out['startup_s']} s")
            healthy = Phase("healthy")
            model = _model(dep.url)
            routes = [_complete(dep.url, model, p)["prfaas"]["route"] for p in
                      ("short one", "short two", "long " * 260, "longer " * 200)]
            healthy.events.append(f"requests routed {routes}")
            ready = _watch(prom, healthy, lambda _: _targets_up(prom, len(targets)), 30.0)
            healthy.events.append(f"all {len(targets)} targets up: {ready}")
            _watch(prom, healthy, lambda _: False, baseline_s)
            out["phases"].append(healthy.to_json())

            part = Phase("partition")
            dep.netns.set_up(False)
            part.events.append("veth down")
            fired = _watch(prom, part, lambda _: _expected(part), fault_limit_s)
            _watch(prom, part, lambda _: False, hold_after_s if fired else 0.0)
            dep.netns.set_up(True)
            part.fault_end_s = part.now()
            part.events.append(f"veth up (expected alerts fired: {fired})")
            _watch(prom, part, lambda alerts: not alerts and _all_up(dep), fault_limit_s)
            out["phases"].append(part.to_json())
            log(f"partition: {part.to_json()}")

            kill = Phase("worker-kill")
            os.kill(dep.pid(FAULTED["worker-kill"]), signal.SIGKILL)
            kill.events.append(f"SIGKILL {FAULTED['worker-kill']}")
            _watch(prom, kill, lambda _: _expected(kill) and _all_up(dep), fault_limit_s)
            kill.fault_end_s = kill.now()
            kill.events.append("worker up again")
            _watch(prom, kill, lambda alerts: not alerts, fault_limit_s)
            out["phases"].append(kill.to_json())
            log(f"worker-kill: {kill.to_json()}")

            out["queries"] = {q: len(prom.query(q)) for q in queries}
            out["targets"] = {t["targets"][0]: t["labels"].get("worker", "router")
                              for t in targets}
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def _model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def _targets_up(prom: PrometheusServer, n: int) -> bool:
    return sum(1 for r in prom.query("up == 1")) == n


def _expected(phase: Phase) -> bool:
    return all(phase.fired(name, worker) for name, worker in EXPECTED[phase.name])


def verdict(result: dict[str, Any]) -> list[str]:
    """What the drill shows wrong (empty: every check holds). Per fault: its expected alert
    fired, every alert that fired concerns the faulted component (the negative control: the
    other workers and the link stay quiet), and each resolved after the fault ended. Healthy:
    nothing fired."""
    problems: list[str] = []
    address = {w: a for a, w in result["targets"].items()}
    phases = {p["phase"]: p for p in result["phases"]}
    for a in phases["healthy"]["alerts"]:
        if a["firing_s"] is not None:
            problems.append(f"healthy: {a['alertname']} {a['labels']} fired")
    for name, expected in EXPECTED.items():
        phase = phases[name]
        faulted = FAULTED[name]
        for alertname, worker in expected:
            if not any(a["alertname"] == alertname and a["firing_s"] is not None
                       and (worker is None or a["labels"].get("worker") == worker)
                       for a in phase["alerts"]):
                problems.append(f"{name}: {alertname} ({worker or 'any'}) did not fire")
        for a in phase["alerts"]:
            labels = a["labels"]
            ours = (labels.get("worker") == faulted or labels.get("instance") == address[faulted]
                    or (name == "partition" and a["alertname"] == "PrfaasLinkDown"))
            if a["firing_s"] is not None and not ours:
                problems.append(f"{name}: {a['alertname']} {labels} fired, not about {faulted}")
            if a["resolved_s"] is None:
                problems.append(f"{name}: {a['alertname']} {labels} did not resolve")
            elif phase["fault_end_s"] is not None and a["firing_s"] is not None \
                    and a["resolved_s"] < phase["fault_end_s"] and name == "partition":
                problems.append(f"{name}: {a['alertname']} resolved before the link came back")
    return problems


def record(result: dict[str, Any], path: str) -> dict[str, Any]:
    """Write the drill's result with its verdict and host beside it (a results JSON)."""
    problems = verdict(result)
    out = {**result, "problems": problems, "ok": not problems, "backend": "native",
           "host": f"{os.cpu_count()}-core {platform.machine()} host, shared by the "
                   "deployment's processes and Prometheus",
           "date": time.strftime("%Y-%m-%d")}
    with open(path, "w") as f:
        f.write(json.dumps(out, indent=2) + "\n")
    return out
