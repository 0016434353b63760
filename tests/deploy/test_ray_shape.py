"""Role changes live on a 3-node Ray cluster (all nodes on 127.0.0.1): drain, restart the actor's
process in its new role, rejoin; a failed start restores the old role; bad changes are refused.

The deployment (RayDeployment, this process its Ray driver) runs the tiny native model:
prfaas-0 on the dc_prfaas node, pd-0 (pd-p), pd-1 and pd-2 (pd-d) on dc_local, the router on
the head. The shape controller's own solves are switched off (a period longer than the test);
changes are asked through `POST /shape/change`, which goes through the same controller checks,
and carried out by the deployment's ShapeExecutor. Shown, in order:
1. a change that fails (pd-2 to pd-p while the test holds the port the executor gives it):
   pd-2 is back as pd-d at a new pid, the router says `ok: false` and why, it decodes again;
2. a change under load: pd-1 (pd-d) becomes pd-p while requests decode on it; nothing is lost,
   every reply's tokens and text equal `prfaas generate`'s (the greedy model in-process), at
   least one of them was on pd-1 when the change began (caught in it), the drain waited for it;
   /health and /metrics show the new role, and later requests decode on pd-2 and take the
   route the new split's t gives them (that split's t is 0 here: every later request is
   offloaded, so none is prefilled on pd-0 or pd-1);
3. refusals with the reason (409): pd-2 to pd-p would leave no decoder, pd-0 to pd-d would undo
   the last move within hold_s; a bad role is a 400. Their counts are in /metrics.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(900)
THRESHOLD_TOKENS = 256
MAX_TOKENS = 48
TOPOLOGY = f"""
name: ray-shape-test
model: {{preset: tiny, threads: 1, seed: 0}}
policy: {{name: prfaas-threshold, threshold_tokens: {THRESHOLD_TOKENS}}}
profile: cpu-tiny
router: {{port: 0}}
link: {{rate_gbps: 0.05, connections: 2}}
timeouts: {{connect_s: 5, prefill_s: 120, kv_s: 120, token_s: 60}}
health: {{interval_s: 0.5, timeout_s: 2.0, failures_before_down: 3, successes_before_up: 2}}
shape: {{period_s: 100000, hold_s: 600, cooldown_s: 0}}
ray:
  resources: {{prfaas: dc_prfaas, pd-p: dc_local, pd-d: dc_local, router: router}}
workers:
  - {{name: prfaas-0, role: prfaas}}
  - {{name: pd-0, role: pd-p, max_batch: 8}}
  - {{name: pd-1, role: pd-d, max_batch: 8}}
  - {{name: pd-2, role: pd-d, max_batch: 8}}
"""


def _call(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(f"{url}{path}", method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _complete(url: str, prompt: str) -> dict[str, Any]:
    status, body = _call(url, "/v1/completions", {"model": "prfaas-tiny-kda", "prompt": prompt,
                                                  "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    return {**body, "done_s": time.monotonic()}


def _wait_change_over(url: str, limit_s: float = 240.0) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        _, shape = _call(url, "/shape")
        if shape["change"] is None and shape["history"]:
            return dict(shape)
        time.sleep(0.2)
    raise AssertionError(f"change not over in {limit_s} s: {_call(url, '/shape')[1]}")


def _prompts(tag: str, n: int) -> list[str]:
    return [f"{tag} question {i}: " + "why? " * (i % 4) for i in range(n)]


def test_role_changes_on_ray(ray_cluster: Any, engine: Any, tmp_path: Path) -> None:
    from prfaas.serve.deploy.ray.deployment import RayDeployment
    from prfaas.serve.deploy.ray.spec import load_ray_topology

    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    topology, spec = load_ray_topology(path)
    expected: dict[str, list[int]] = {}

    def check(prompt: str, reply: dict[str, Any]) -> None:
        if prompt not in expected:
            expected[prompt] = engine.generate(engine.tokenizer.encode(prompt), MAX_TOKENS)
        assert reply["prfaas"]["token_ids"] == expected[prompt], (prompt, reply["prfaas"])
        assert reply["choices"][0]["text"] == engine.tokenizer.decode(expected[prompt])

    t0 = time.monotonic()
    logs = tmp_path / "logs"

    def tail(name: str) -> str:
        path = logs / f"{name}.log"
        return path.read_text()[-4000:] if path.exists() else "(no log)"

    with RayDeployment(topology, spec, ray_cluster.address, start_timeout_s=300,
                       log_dir=str(logs)) as dep:
        up_s = time.monotonic() - t0
        url = dep.url
        assert url.startswith("http://127.0.0.1:")  # the router's node is on loopback
        members = _call(url, "/health")[1]["members"]
        assert all(m["up"] for m in members.values())
        assert dep.executor is not None
        first_pids = {n: m["pid"] for n, m in members.items()}
        nodes = ray_cluster.nodes
        assert {n: m["node_id"] for n, m in members.items()} == {
            "prfaas-0": nodes["dc_prfaas"], "pd-0": nodes["dc_local"],
            "pd-1": nodes["dc_local"], "pd-2": nodes["dc_local"]}

        # 1. a start that fails restores the old role: the test holds the port pd-2 gets
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        port_for = dep.executor.ports
        calls: list[str] = []

        def ports_once_held(name: str) -> tuple[int, int]:
            calls.append(name)  # the first start gets the held port; the restore real ones
            port, kv_port = port_for(name)
            return (held.getsockname()[1] if len(calls) == 1 else port), kv_port

        dep.executor.ports = ports_once_held
        try:
            status, body = _call(url, "/shape/change", {"instance": "pd-2", "role": "pd-p"})
            assert status == 200, body
            failed = _wait_change_over(url)["history"][-1]
        finally:
            dep.executor.ports = port_for
            held.close()
        assert calls == ["pd-2", "pd-2"]  # the failed start, then the restore
        assert failed["instance"] == "pd-2" and not failed["ok"]
        assert "pd-p did not start" in failed["detail"], failed
        health = _call(url, "/health")[1]["members"]
        assert health["pd-2"]["role"] == "pd-d" and health["pd-2"]["up"]
        assert health["pd-2"]["pid"] != first_pids["pd-2"]  # restarted, in its old role
        warm_prompts = _prompts("after-failure", 4)
        with ThreadPoolExecutor(4) as pool:
            warm = list(pool.map(lambda p: _complete(url, p), warm_prompts))
        for p, r in zip(warm_prompts, warm, strict=True):
            check(p, r)
        used = [(r["prfaas"]["decode_node"], r["prfaas"]["retried"], r["prfaas"]["retry_reason"])
                for r in warm]
        assert "pd-2" in {u[0] for u in used}, (used, tail("router"), tail("pd-2"))

        # 2. pd-1 (pd-d) to pd-p while requests decode on it
        prompts = _prompts("under-change", 8)
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_complete, url, p) for p in prompts]
            time.sleep(0.5)  # they are prefilled or decoding now (48 tokens take seconds)
            asked_s = time.monotonic()
            status, body = _call(url, "/shape/change", {"instance": "pd-1", "role": "pd-p"})
            assert status == 200, body
            replies = [f.result() for f in futures]
        done = _wait_change_over(url)
        change_s = time.monotonic() - asked_s
        moved = done["history"][-1]
        for p, r in zip(prompts, replies, strict=True):  # nothing lost, the text it had
            check(p, r)
        # caught in the change: decoded on pd-1 and finished after the change was asked
        caught = [r for r in replies if r["prfaas"]["decode_node"] == "pd-1"
                  and r["done_s"] > asked_s]
        assert caught, [(r["prfaas"]["decode_node"], r["done_s"] - asked_s) for r in replies]
        assert moved["ok"] and moved["instance"] == "pd-1"
        assert (moved["from"], moved["to"]) == ("pd-d", "pd-p")
        assert moved["drain_s"] > 0  # it waited for the requests decoding there
        health = _call(url, "/health")[1]["members"]
        assert health["pd-1"]["role"] == "pd-p" and health["pd-1"]["up"]
        assert health["pd-1"]["role_changes"] == 1 and health["pd-1"]["restarts"] == 0
        assert health["pd-1"]["pid"] != first_pids["pd-1"]
        metrics = _call(url, "/metrics")[1]
        assert 'prfaas_worker_role{role="pd-p",worker="pd-1"} 1.0' in metrics
        assert 'prfaas_worker_role{role="pd-d",worker="pd-1"} 0.0' in metrics
        after = _prompts("after-change", 6)
        with ThreadPoolExecutor(6) as pool:
            later = list(pool.map(lambda p: _complete(url, p), after))
        # the new split's t, put into force at the join (the router's metric)
        [t_line] = [ln for ln in metrics.splitlines() if ln.startswith("prfaas_threshold_tokens ")]
        t_new = float(t_line.split()[1])
        for p, r in zip(after, later, strict=True):
            check(p, r)
            assert r["prfaas"]["decode_node"] == "pd-2"  # the only decoder left
            n = r["usage"]["prompt_tokens"]
            assert r["prfaas"]["route"] == ("prfaas" if n > t_new else "pd"), (n, t_new, r)

        # 3. refusals, with the reason, and bad input
        status, body = _call(url, "/shape/change", {"instance": "pd-2", "role": "pd-p"})
        assert status == 409 and body["refused"]["kind"] == "empty_role", body
        assert "would leave 0 decode" in body["refused"]["reason"]
        status, body = _call(url, "/shape/change", {"instance": "pd-0", "role": "pd-d"})
        assert status == 409 and body["refused"]["kind"] == "flap", body
        assert "pd-1" in body["refused"]["reason"]
        status, body = _call(url, "/shape/change", {"instance": "pd-0", "role": "decoder"})
        assert status == 400
        status, body = _call(url, "/shape/change", {"instance": "prfaas-0", "role": "pd-d"})
        assert status == 409 and body["refused"]["kind"] == "unknown", body
        metrics = _call(url, "/metrics")[1]
        for outcome, count in (("requested", 2), ("completed", 1), ("failed", 1),
                               ("refused_empty_role", 1), ("refused_flap", 1)):
            assert f'prfaas_shape_decisions_total{{outcome="{outcome}"}} {count}.0' in metrics
        log = list(dep.executor.log)
    print(f"\nrole changes on Ray: up in {up_s:.1f} s; failed change restored pd-0 as pd-p "
          f"({failed['detail'][:60]}...); pd-1 pd-d -> pd-p in {change_s:.1f} s (drain "
          f"{moved['drain_s']:.2f} s, restart {log[-1]['restart_s']:.2f} s), {len(caught)} "
          f"requests caught on it, all {len(replies)} exact")
