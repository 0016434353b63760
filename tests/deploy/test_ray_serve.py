"""`prfaas serve --topology topologies/ray-local.yaml --ray ADDRESS` on a 3-node Ray cluster.

The CLI runs as its own process (a Ray driver) against the cluster of conftest.py. Shown: every
component on the node its custom resource names (by Ray node id, from the router's /health),
mixed prompts (both routes) with exactly the tokens and text of `prfaas generate` (the greedy
`Engine.generate` of the same tiny model, computed here in-process, as tests/serve do), and the
PrfaaS worker SIGKILLed under load: no request lost, Ray restarts it on the same node with a new
pid, and the router's membership sees it down and back.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from prfaas.integrations.vllm.reference import post_completion

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
THRESHOLD_TOKENS = 256  # cheaper "long" prompts than ray-local.yaml's 1024
MAX_TOKENS = 8
KILL_AT_S = 4.0


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        body: dict[str, Any] = json.load(resp)
        return body


def _complete(url: str, prompt: str) -> dict[str, Any]:
    status, reply = post_completion(url, {"model": "prfaas-tiny-kda", "prompt": prompt,
                                          "max_tokens": MAX_TOKENS, "temperature": 0}, 300)
    assert status == 200, reply
    return reply


def _prompts() -> list[str]:
    out = []
    for i in range(16):
        if i % 2:  # over t: offloaded to the PrfaaS worker
            out.append(f"Long request {i} for the remote prefill cluster. " * (6 + i % 3))
        else:
            out.append(f"Short question {i}: " + "why? " * (i % 5))
    return out


class Serve:
    """`prfaas serve ... --ray ADDRESS` as a child process; its stdout read by a thread."""

    def __init__(self, address: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prfaas", "serve", "--topology",
             str(ROOT / "topologies" / "ray-local.yaml"), "--ray", address, "--port", "0",
             "--threshold", str(THRESHOLD_TOKENS)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip())

    def router_url(self, limit_s: float = 300) -> str:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if line.startswith("router: "):
                return line.split()[1]
        raise AssertionError("no router URL; output:\n" + "\n".join(self.seen))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _wait_back(url: str, name: str, old_pid: int, limit_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        member: dict[str, Any] = _get(f"{url}/health")["members"][name]
        if member["up"] and member["pid"] not in (None, old_pid):
            return member
        time.sleep(0.2)
    raise AssertionError(f"{name} not back in {limit_s} s: {_get(f'{url}/health')['members']}")


def test_ray_serve_placed_exact_and_survives_a_kill(ray_cluster: Any, engine: Any) -> None:
    prompts = _prompts()
    expected = [engine.generate(engine.tokenizer.encode(p), MAX_TOKENS) for p in prompts]
    lengths = [len(engine.tokenizer.encode(p)) for p in prompts]
    assert sum(n > THRESHOLD_TOKENS for n in lengths) == 8  # both routes are exercised
    serve = Serve(ray_cluster.address)
    try:
        url = serve.router_url()
        health = _get(f"{url}/health")
        members = health["members"]
        nodes = ray_cluster.nodes
        assert len(set(nodes.values())) == 3  # three distinct nodes: placement can be wrong
        assert health["node_id"] == nodes["router"]
        assert members["prfaas-0"]["node_id"] == nodes["dc_prfaas"]
        assert members["pdp-0"]["node_id"] == members["pdd-0"]["node_id"] == nodes["dc_local"]
        old_pid = members["prfaas-0"]["pid"]
        assert all(m["up"] and isinstance(m["pid"], int) for m in members.values())

        futures: list[Future[dict[str, Any]]] = []
        killed = False
        with ThreadPoolExecutor(max_workers=16) as pool:
            t0 = time.monotonic()
            for i, prompt in enumerate(prompts):
                while time.monotonic() < t0 + i * 0.5:  # two a second; the kill on schedule
                    if not killed and time.monotonic() >= t0 + KILL_AT_S:
                        os.kill(old_pid, signal.SIGKILL)
                        killed = True
                    time.sleep(0.01)
                futures.append(pool.submit(_complete, url, prompt))
            replies = [f.result() for f in futures]
        back = _wait_back(url, "prfaas-0", old_pid)
        after = _complete(url, "After the restart, a long prompt again. " * 10)
    finally:
        serve.stop()
    assert killed
    for i, (reply, tokens) in enumerate(zip(replies, expected, strict=True)):  # 0 lost, exact
        assert reply["prfaas"]["token_ids"] == tokens, (i, reply["prfaas"])
        assert reply["choices"][0]["text"] == engine.tokenizer.decode(tokens)
    routes = {r["prfaas"]["route"] for r in replies}
    assert routes == {"prfaas", "pd"}
    assert back["node_id"] == nodes["dc_prfaas"] and back["pid"] != old_pid
    assert back["restarts"] >= 1 and back["transitions"] >= 2  # seen down, then up
    assert after["prfaas"]["route"] == "prfaas" and after["prfaas"]["prefill_node"] == "prfaas-0"
    assert serve.proc.returncode == 0
    hit = [r["prfaas"] for r in replies if r["prfaas"]["retried"] or r["prfaas"]["resumed"]]
    print(f"\nkill: {len(hit)} of {len(replies)} requests retried or resumed; prfaas-0 pid "
          f"{old_pid} -> {back['pid']} on node {back['node_id'][:12]}")
