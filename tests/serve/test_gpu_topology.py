"""GPU deployments on a machine without one: the topology's devices and GPUs, the start-time
check that fails in one line naming the worker and its device, and the worker process's own
refusal. The shipped GPU topologies parse; nothing here starts CUDA."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prfaas.core.errors import ConfigError
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.gpus import DeviceError, check_devices, count_gpus, gpu_env, parse_gpus
from prfaas.serve.topology import load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]


def _native(model: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    return {"name": "t", "model": {"preset": "tiny", **(model or {})},
            "workers": [{"name": "prfaas-0", "role": "prfaas", **worker},
                        {"name": "pdd-0", "role": "pd-d"}]}


def test_gpus_forms_and_bad_values() -> None:
    assert parse_gpus(None, "w") == ()
    assert parse_gpus(0, "w") == (0,) and parse_gpus("0, 2", "w") == (0, 2)
    assert parse_gpus([3, "1"], "w") == (3, 1)
    for bad in ("x", [0, 0], "", True, -1, [1.5], {"a": 1}):
        with pytest.raises(ConfigError, match="w"):
            parse_gpus(bad, "w")


def test_where_each_native_worker_computes() -> None:
    topo = parse_topology(_native({"device": "cuda"}, gpus="1"))
    assert [(w.name, topo.device_of(w), w.gpus) for w in topo.workers] == [
        ("prfaas-0", "cuda", (1,)), ("pdd-0", "cuda", ())]
    mixed = parse_topology({**_native({"device": "cuda:0"}),
                            "workers": [{"name": "prfaas-0", "role": "prfaas"},
                                        {"name": "pdd-0", "role": "pd-d", "device": "cpu"}]})
    assert [mixed.device_of(w) for w in mixed.workers] == ["cuda:0", "cpu"]
    again = parse_topology(mixed.to_dict())  # the launcher's dumped copy says the same
    assert [again.device_of(w) for w in again.workers] == ["cuda:0", "cpu"]
    assert parse_topology(_native()).device_of(parse_topology(_native()).workers[0]) == "cpu"


@pytest.mark.parametrize(("model", "worker", "match"), [
    ({"device": "gpu"}, {}, "model.device"),
    ({}, {"device": "cuda:x"}, "workers.prfaas-0.device"),
    ({}, {"gpus": "0"}, "runs on the cpu"),
    ({"device": "cuda:2"}, {"gpus": "0,1"}, "cuda:0..cuda:1"),
])
def test_bad_native_devices_name_the_field(model: dict[str, Any], worker: dict[str, Any],
                                           match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_topology(_native(model, **worker))


def _vllm(vllm_device: str = "cuda", **worker: Any) -> dict[str, Any]:
    return {"name": "v", "vllm": {"device": vllm_device},
            "workers": [{"name": "prfaas-0", "role": "prfaas", "engine": "vllm", **worker},
                        {"name": "pdd-0", "role": "pd-d", "engine": "vllm", "gpus": 1}]}


@pytest.mark.parametrize(("worker", "match"), [
    ({}, "a vLLM instance on cuda needs its GPUs"),
    ({"gpus": 0, "cores": "0"}, "not pinned to CPUs"),
    ({"gpus": 0, "device": "cuda"}, "vllm.device"),
])
def test_bad_vllm_gpu_workers_name_the_field(worker: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_topology(_vllm(**worker))
    with pytest.raises(ConfigError, match=r"vllm\.device"):
        parse_topology({**_vllm(gpus=0), "vllm": {"device": "tpu"}})


def test_the_shipped_gpu_topologies_parse() -> None:
    native = load_topology(ROOT / "topologies" / "gpu-local.yaml")
    assert {native.device_of(w) for w in native.workers} == {"cuda"}
    assert native.link.wire_dtype == "bf16" and native.model["preset"] == "kimi_linear"
    vllm = load_topology(ROOT / "topologies" / "vllm-gpu.yaml")
    assert vllm.vllm is not None and vllm.vllm.device == "cuda"
    assert all(w.gpus == (0,) and w.cores is None for w in vllm.workers)


def test_visible_devices_honour_the_launchers_own() -> None:
    assert gpu_env((1,), {}) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert gpu_env((1, 0), {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == {"CUDA_VISIBLE_DEVICES": "5,4"}
    assert gpu_env((), {"CUDA_VISIBLE_DEVICES": "4"}) == {}


def test_the_start_check_counts_gpus_and_names_the_worker() -> None:
    topo = parse_topology(_native({"device": "cuda"}, gpus="0,1"))
    calls: list[int] = []

    def two() -> int:
        calls.append(2)
        return 2

    check_devices(topo, topo.workers, two)  # control: a host with both GPUs passes
    with pytest.raises(DeviceError) as exc:
        check_devices(topo, topo.workers, lambda: 1)
    assert str(exc.value) == ("worker prfaas-0: device cuda (gpus 0,1) needs GPU 1, but this "
                              "host has 1 (0..0)")
    with pytest.raises(DeviceError, match="worker pdd-0: device cuda, but this host has no"):
        check_devices(topo, topo.workers[1:], lambda: 0)
    cpu = parse_topology(_native())
    check_devices(cpu, cpu.workers, lambda: calls.append(0) or 0)  # type: ignore[func-returns-value]
    assert calls == [2]  # no worker on a GPU: nothing counted


def test_this_machine_has_no_gpu_to_count() -> None:
    assert count_gpus() == 0


def test_a_deployment_asking_for_cuda_here_fails_at_start_in_one_line(tmp_path: Path) -> None:
    topo = parse_topology({**_native({"device": "cuda:1"}), "router": {"port": 0}})
    dep = Deployment(topo, log_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(DeviceError) as exc:
        dep.start()
    message = str(exc.value)
    assert "\n" not in message and message.startswith("worker prfaas-0: device cuda:1")
    assert "no CUDA GPU" in message
    assert dep.procs == {} and not (tmp_path / "prfaas-0.log").exists()  # nothing started
    assert time.monotonic() - t0 < 100
    # the same topology on the cpu starts the check's way through (control: not refused)
    check_devices(parse_topology(_native()), parse_topology(_native()).workers)


def test_a_worker_process_on_a_missing_gpu_exits_with_one_line(tmp_path: Path) -> None:
    """Started by something other than the launcher (Ray, a test), the worker itself refuses,
    naming itself and its device."""
    path = tmp_path / "t.yaml"
    parse_topology(_native({"device": "cuda"})).with_ports().dump(path)
    done = subprocess.run([sys.executable, "-m", "prfaas.serve.deploy.proc", "--topology",
                           str(path), "--name", "prfaas-0"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == ["[prfaas-0] error: workers.prfaas-0.device='cuda': no CUDA GPU here "
                     "(torch.cuda.is_available() is False; torch "
                     f"{_torch_version()} is a CPU build)"]


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
