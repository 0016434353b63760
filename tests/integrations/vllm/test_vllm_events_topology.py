"""`vllm.kv_events` in a topology: parsed, validated, given a port per instance, passed to
each vLLM server as `--kv-events-config`, and dumped/reloaded unchanged (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.deploy import worker_spec
from prfaas.integrations.vllm.engine_backend import VllmEngineBackend
from prfaas.security.spec import SecuritySpec
from prfaas.serve.topology import Topology, load_topology
from prfaas.serve.vllm_settings import parse_vllm

ROOT = Path(__file__).resolve().parents[3]


def test_events_ports_and_server_flag(tmp_path: Path) -> None:
    topo = load_topology(ROOT / "topologies" / "vllm-local-llama.yaml").with_ports()
    assert topo.vllm is not None and topo.vllm.kv_events
    ports = [w.events_port for w in topo.workers]
    assert all(ports) and len(set(ports)) == len(ports)
    cmd = worker_spec(topo, topo.worker("pdp-0")).command()
    conf = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    assert conf == {"enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": f"tcp://*:{topo.worker('pdp-0').events_port}",
                    "topic": "pdp-0"}
    topo.dump(tmp_path / "t.yaml")
    again = load_topology(tmp_path / "t.yaml")
    assert [w.events_port for w in again.workers] == ports and again.vllm is not None
    assert again.vllm.kv_events
    # events off: no flag, no port
    off = dataclasses.replace(topo, vllm=dataclasses.replace(topo.vllm, kv_events=False))
    assert "--kv-events-config" not in worker_spec(off, off.worker("pdp-0")).command()
    unresolved = load_topology(ROOT / "topologies" / "vllm-local-llama.yaml")
    with pytest.raises(ConfigError, match="events_port"):
        worker_spec(unresolved, unresolved.worker("pdp-0"))


def test_kv_events_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"vllm\.kv_events"):
        parse_vllm({"kv_events": "yes"}, None)


def _tls(topo: Topology, tmp_path: Path) -> Topology:
    return topo.with_security(SecuritySpec(tls_dir=str(tmp_path / "certs")))


def test_events_beside_tls_go_over_a_private_unix_socket_or_not_at_all(tmp_path: Path) -> None:
    """vLLM's ZMQ publisher has no TLS or authentication and its events carry prompts' token
    ids: beside TLS the launcher gives the instances a private folder for unix sockets, and an
    instance (or router) asked for TCP events beside TLS refuses to start."""
    topo = _tls(load_topology(ROOT / "topologies" / "vllm-local-llama.yaml").with_ports(),
                tmp_path)
    backend = VllmEngineBackend(topo)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    launched = backend.launch_topology(frozenset(w.name for w in topo.workers), run)
    assert launched.vllm is not None and launched.vllm.events_dir == str(run / "kv-events")
    assert os.stat(launched.vllm.events_dir).st_mode & 0o777 == 0o700
    cmd = worker_spec(launched, launched.worker("pdp-0")).command()
    conf = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    assert conf["endpoint"] == f"ipc://{run}/kv-events/pdp-0.events"
    # the router subscribes to the same socket
    assert VllmEngineBackend(launched).event_endpoints()["pdp-0"] == conf["endpoint"]
    # the folder survives a dump and reload (the instances read the resolved topology)
    launched.dump(tmp_path / "t.yaml")
    assert load_topology(tmp_path / "t.yaml").vllm == launched.vllm
    # negative controls: TCP beside TLS, an instance on another host, a folder others can read
    with pytest.raises(ConfigError, match="unix sockets"):
        worker_spec(topo, topo.worker("pdp-0"))
    with pytest.raises(ConfigError, match="unix sockets"):
        backend.event_endpoints()
    with pytest.raises(ConfigError, match="pdd-0 runs elsewhere"):
        backend.launch_topology(frozenset({"prfaas-0", "pdp-0"}), tmp_path / "run2")
    os.chmod(launched.vllm.events_dir, 0o755)
    with pytest.raises(ConfigError, match="mode 0700"):
        worker_spec(launched, launched.worker("pdp-0"))
    # without TLS nothing changes: TCP, as test_events_ports_and_server_flag shows
    plain = load_topology(ROOT / "topologies" / "vllm-local-llama.yaml").with_ports()
    assert VllmEngineBackend(plain).launch_topology(frozenset(), run) is plain
