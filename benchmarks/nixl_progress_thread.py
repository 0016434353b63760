"""What NIXL's progress thread costs on a CPU: a bare NIXL agent, idle, with and without it.

vLLM's NixlConnector creates its agent with `nixl_agent_config(num_threads=4,
capture_telemetry=True)`, so `enable_prog_thread` keeps its default, True. This starts the same
agent in this process both ways, waits IDLE_S with no transfer at all and prints the CPU seconds
each thread the agent added used meanwhile (/proc/self/task/*/stat). A few seconds, no vLLM.

    .venv/bin/python benchmarks/nixl_progress_thread.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

IDLE_S = 5.0


def _cpu_s(tid: str) -> float:
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(prog_thread: bool) -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    before = set(os.listdir("/proc/self/task"))
    agent = nixl_agent(str(uuid.uuid4()), nixl_agent_config(
        enable_prog_thread=prog_thread, num_threads=4, capture_telemetry=True))
    new = sorted(set(os.listdir("/proc/self/task")) - before)
    start = {t: _cpu_s(t) for t in new}
    time.sleep(IDLE_S)
    used = sorted((round(_cpu_s(t) - start[t], 2) for t in new), reverse=True)
    print(f"enable_prog_thread={prog_thread}: {len(new)} threads added, CPU s per thread over "
          f"{IDLE_S:.0f} s idle: {used} (load average {os.getloadavg()[0]:.1f})", flush=True)
    del agent


def main() -> int:
    if len(sys.argv) > 1:  # one agent per process: the child
        one(sys.argv[1] == "1")
        return 0
    for flag in ("1", "0"):
        subprocess.run([sys.executable, __file__, flag], check=True, timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
