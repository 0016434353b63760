"""`router.cores` and serve/cores.py's pinning: parsed and checked with the topology, a dumped
topology keeps them, and a pinned block leaves the thread's CPUs as they were."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from needs import needs
from prfaas.core.errors import ConfigError
from prfaas.serve.cores import pin, pinned_thread
from prfaas.serve.topology import load_topology, parse_topology

VLLM_LOCAL = Path(__file__).resolve().parents[2] / "topologies" / "vllm-local.yaml"


def _raw() -> dict:
    return yaml.safe_load(VLLM_LOCAL.read_text())


def test_router_cores_parse_and_survive_a_dump(tmp_path: Path) -> None:
    raw = _raw()
    assert parse_topology(raw).router_cores is None  # unpinned unless asked
    assert "cores" not in parse_topology(raw).to_dict()["router"]
    raw["router"]["cores"] = "1"
    topo = parse_topology(raw)
    assert topo.router_cores == "1"
    path = tmp_path / "dumped.yaml"
    topo.dump(path)
    assert load_topology(path).router_cores == "1"


@pytest.mark.parametrize("bad", ["one", "", "0-x", ","])
def test_bad_router_cores_are_refused_with_their_value(bad: str) -> None:
    raw = _raw()
    raw["router"]["cores"] = bad
    with pytest.raises(ConfigError, match="cores"):
        parse_topology(raw)


def test_pinned_thread_pins_only_the_block_and_restores() -> None:
    before = os.sched_getaffinity(0)
    target = min(before)
    seen: dict[str, set[int]] = {}

    def other() -> None:
        seen["other"] = os.sched_getaffinity(0)

    with pinned_thread(str(target)):
        seen["inside"] = os.sched_getaffinity(0)
        t = threading.Thread(target=other)  # started inside: inherits the pin
        t.start()
        t.join()
    assert seen["inside"] == {target} == seen["other"]
    assert os.sched_getaffinity(0) == before
    with pinned_thread(None):  # unpinned: nothing changes
        assert os.sched_getaffinity(0) == before


def test_pin_to_a_cpu_the_host_lacks_is_a_clear_error() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError, match="cannot pin"), pinned_thread("4095", "router.cores"):
        pass
    assert os.sched_getaffinity(0) == before
    with pytest.raises(ConfigError, match=r"router\.cores"):
        pin("4095", "router.cores")


_PIN_SCRIPT = """
import os, sys, threading
from prfaas.serve.cores import pin
ready, stop = threading.Event(), threading.Event()
threading.Thread(target=lambda: (ready.set(), stop.wait()), daemon=True).start()
ready.wait()
cpu = sys.argv[2]
if sys.argv[1] == "process":
    pin(cpu)
else:  # the control: only the calling thread, as a bare sched_setaffinity(0) does
    os.sched_setaffinity(0, {int(cpu)})
tids = [int(t) for t in os.listdir("/proc/self/task")]
print(",".join(str(c) for c in sorted(set().union(*(os.sched_getaffinity(t) for t in tids)))),
      len(tids))
"""


@needs("cpus2")
def test_pin_moves_threads_started_before_it() -> None:
    """A process's threads from before the pin (numpy's and torch's pools start at import) are
    pinned too; the control, pinning only the calling thread, leaves the other one unpinned."""
    import subprocess
    import sys

    cpus = os.sched_getaffinity(0)  # 2 or more (needs): a pinned thread tells from another
    target = min(cpus)
    src = str(Path(__file__).resolve().parents[2] / "src")

    def union(mode: str) -> str:
        out = subprocess.run([sys.executable, "-c", _PIN_SCRIPT, mode, str(target)],
                             capture_output=True, text=True, timeout=120, check=True,
                             env={**os.environ, "PYTHONPATH": src})
        return out.stdout.split()[0]

    assert union("process") == str(target)
    assert union("thread") == ",".join(str(c) for c in sorted(cpus))


def _thread_cpus(pid: int) -> set[int]:
    """The union of the CPUs every thread of process `pid` may run on, from the kernel."""
    from prfaas.serve.cores import parse_cores

    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out |= parse_cores(line.split(":", 1)[1].strip()) or set()
    return out


def _router_cpus(tmp_path: Path, cores: str | None) -> set[int]:
    """Start the router process of local.yaml (free port, `router.cores` = `cores`; its
    workers need not run) until it answers /health, read its threads' CPUs, stop it."""
    import subprocess
    import sys
    import time
    import urllib.request

    from prfaas.serve.deploy.launcher import reap, terminate
    from prfaas.serve.ports import free_port

    local = Path(__file__).resolve().parents[2] / "topologies" / "local.yaml"
    raw = yaml.safe_load(local.read_text())
    raw["router"] = {"host": "127.0.0.1", "port": free_port("127.0.0.1"),
                     **({"cores": cores} if cores is not None else {})}
    path = tmp_path / f"router-{cores}.yaml"
    parse_topology(raw, base=local.parent).dump(path)
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.Popen([sys.executable, "-m", "prfaas.serve.deploy.proc", "--topology",
                             str(path), "--name", "router"], env={**os.environ, "PYTHONPATH": src},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{raw['router']['port']}/health"
        while True:
            assert proc.poll() is None, "the router exited"
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "router not up in 120 s"
                time.sleep(0.2)
        return _thread_cpus(proc.pid)
    finally:
        terminate([proc])
        reap([proc], 30.0)


@needs("cpus2")
def test_the_router_process_runs_on_router_cores(tmp_path: Path) -> None:
    """Every thread of a router started with `router.cores` is on them, read from the kernel
    once it serves; the control, the same router without them, runs anywhere this test can."""
    cpus = os.sched_getaffinity(0)  # 2 or more (needs): a pinned process tells from another
    target = max(cpus)
    assert _router_cpus(tmp_path, str(target)) == {target}
    assert _router_cpus(tmp_path, None) == cpus
