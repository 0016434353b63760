"""`vllm.kv_events` in a topology: parsed, validated, given a port per instance, passed to
each vLLM server as `--kv-events-config`, and dumped/reloaded unchanged (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.deploy import worker_spec
from prfaas.serve.topology import load_topology
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
