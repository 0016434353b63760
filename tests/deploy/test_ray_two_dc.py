"""One Ray cluster per datacenter, the PrfaaS one behind the shaped link, on this host.

`prfaas serve --topology (ray-two-dc.yaml) --ray dc_prfaas=ray://NS_HEAD --ray dc_local=HOST_HEAD`
with the PrfaaS cluster's Ray head (and so its prfaas worker) inside a network namespace joined to
the host by a veth pair shaped by tc tbf (serve/deploy/ray/lab.py, the live link's own netns
helper), the local cluster (PD workers, router) on the host, mutual TLS between the two.
Shown: where each process runs (its network namespace, its Ray node); short prompts stay in the
local DC and put no KV on the link (the control), long ones are prefilled in the namespace and
their KV crosses the link, counted by the link itself (the veth's receive counter and the tbf
qdisc's own), not by prfaas; every reply's tokens and text equal `prfaas generate`'s.
Needs the `netns` and `ray` features (tests/needs.py: CAP_NET_ADMIN, `ip`, `tc`; the extra).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from needs import check

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
THRESHOLD_TOKENS = 256
MAX_TOKENS = 8
RATE_GBPS = 0.2
LINK_INDEX = 250  # 249 and up are left to tests; the other netns tests use 248 and 249


def _post(url: str, prompt: str) -> dict[str, Any]:
    body = json.dumps({"model": "prfaas-tiny-kda", "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        reply: dict[str, Any] = json.load(resp)
        return reply


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


@pytest.fixture(scope="module")
def two_dcs() -> Any:
    check("netns", "ray")  # a Ray node in a shaped namespace
    from prfaas.serve.deploy.ray.lab import two_datacenters

    with two_datacenters(RATE_GBPS, index=LINK_INDEX) as dcs:
        yield dcs


def test_two_clusters_across_the_shaped_link(two_dcs: Any, engine: Any, tmp_path: Path) -> None:
    from prfaas.security.certs import ROUTER, Member, init_certs

    raw = yaml.safe_load((ROOT / "topologies" / "ray-two-dc.yaml").read_text())
    raw["security"] = {"tls": {"dir": str(tmp_path / "certs")}}
    init_certs([Member(w["name"]) for w in raw["workers"]] + [Member(ROUTER)],
               tmp_path / "certs")
    topology = tmp_path / "two-dc.yaml"
    topology.write_text(yaml.safe_dump(raw))
    shorts = [f"Short question {i}: " + "why? " * i for i in range(4)]
    longs = [f"Long request {i} for the remote prefill cluster. " * (7 + i) for i in range(4)]
    expected = {p: engine.generate(engine.tokenizer.encode(p), MAX_TOKENS) for p in shorts + longs}
    assert all(len(engine.tokenizer.encode(p)) <= THRESHOLD_TOKENS for p in shorts)
    assert all(len(engine.tokenizer.encode(p)) > THRESHOLD_TOKENS for p in longs)

    link = two_dcs.link
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prfaas", "serve", "--topology", str(topology),
         *two_dcs.ray_args(), "--port", "0", "--threshold", str(THRESHOLD_TOKENS)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the router's line (or the process ends)
            seen.append(line.rstrip())
            if line.startswith("router: "):
                break
        assert seen and seen[-1].startswith("router: "), "\n".join(seen)
        url = seen[-1].split()[1]
        up_s = time.monotonic() - t0
        health = json.load(urllib.request.urlopen(f"{url}/health", timeout=30))
        members = health["members"]
        inodes = {n: _netns_inode(m["pid"]) for n, m in members.items()}  # while they run

        def phase(prompts: list[str]) -> tuple[list[dict[str, Any]], int, int]:
            rx, tbf = link.carried_bytes(), link.qdisc_sent_bytes()
            with ThreadPoolExecutor(len(prompts)) as pool:
                replies = list(pool.map(lambda p: _post(url, p), prompts))
            return replies, link.carried_bytes() - rx, link.qdisc_sent_bytes() - tbf

        short_replies, short_rx, short_tbf = phase(shorts)
        long_replies, long_rx, long_tbf = phase(longs)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
    wall_s = time.monotonic() - t0

    # placement: the PrfaaS worker runs inside the namespace, on the PrfaaS cluster's node;
    # the PD workers and the router on the host, on the local cluster's node
    ns_inode = os.stat(f"/run/netns/{link.name}").st_ino
    assert ns_inode != _netns_inode(os.getpid())
    assert inodes["prfaas-0"] == ns_inode
    assert inodes["pdp-0"] == inodes["pdd-0"] == _netns_inode(os.getpid())
    assert members["prfaas-0"]["node_id"] != members["pdd-0"]["node_id"]
    assert members["pdp-0"]["node_id"] == members["pdd-0"]["node_id"] == health["node_id"]
    worker_lines = {s.split()[0]: s.split() for s in seen if s.startswith("  ")}
    assert worker_lines["prfaas-0"][2].startswith(f"https://{link.ns_ip}:")  # mutual TLS
    assert worker_lines["pdd-0"][2].startswith("http://")

    for prompt, reply in zip(shorts + longs, short_replies + long_replies, strict=True):
        assert reply["prfaas"]["token_ids"] == expected[prompt], reply["prfaas"]
        assert reply["choices"][0]["text"] == engine.tokenizer.decode(expected[prompt])
    assert {r["prfaas"]["route"] for r in short_replies} == {"pd"}
    assert {r["prfaas"]["route"] for r in long_replies} == {"prfaas"}
    assert all(r["prfaas"]["prefill_node"] == "prfaas-0" for r in long_replies)

    # the link's own counters. Control: the short prompts' KV (pd-p -> pd-d, reported by the
    # router) stays in the local DC, so the link carries only health replies and Ray Client
    # chatter meanwhile (0-496 B in the runs here). The long prompts' KV must all cross it
    # (>= what the router reports), plus at most TCP/IP/Ethernet headers (<= ~5% at a
    # 1500-byte MTU), TLS records (22 B per 16 KiB) and that background (256 KiB: over 100x
    # what the control phase shows here)
    short_kv = sum(r["prfaas"]["kv_bytes"] for r in short_replies)
    long_kv = sum(r["prfaas"]["kv_bytes"] for r in long_replies)
    assert short_kv > 0 and short_rx < short_kv / 10  # had it crossed: short_rx >= short_kv
    assert long_kv <= long_rx <= 1.15 * long_kv + 256 * 1024
    assert long_kv <= long_tbf
    assert proc.returncode == 0
    print(f"\ntwo clusters: serve up in {up_s:.1f} s, whole run {wall_s:.1f} s; link "
          f"{link.name} at {RATE_GBPS} Gbps (tbf)\n"
          f"  short x{len(shorts)}: route pd, KV (local DC) {short_kv} B; link carried "
          f"{short_rx} B (veth rx), {short_tbf} B (tbf sent)\n"
          f"  long  x{len(longs)}: route prfaas, KV reported {long_kv} B; link carried "
          f"{long_rx} B (veth rx, {long_rx / long_kv - 1:+.1%}), {long_tbf} B (tbf sent)\n"
          "  placement: " + "; ".join(f"{n} pid {m['pid']} node {m['node_id'][:12]}"
                                      for n, m in members.items()))
