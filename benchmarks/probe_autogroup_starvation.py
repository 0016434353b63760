"""Is a process pinned beside spinning processes starved when it runs in a session of its own?

Why: with the hybrid vLLM test module's routers pinned to core 1, beside the decoder, the
events-off control router (started with `start_new_session`) sat runnable with no CPU for
minutes (docs/sim-vs-live.md), while the main router, in the launcher's session like the vLLM
instances, never did. Under autogroup scheduling (`/proc/sys/kernel/sched_autogroup_enabled`)
each session is a task group of its own, so the session was the suspect. This probe takes vLLM
out of it: SPINNERS processes pinned to core 1, each spinning with sched_yield (a vLLM reader
between steps) or a plain busy loop (a compute thread), started in this process's session, and
a probe process pinned to the same core that, for DURATION_S, sleeps 10 ms and then does ~1 ms
of work in a loop (a router's event loop), started either in the same session or in its own
(setsid). Control: one SCHED_FIFO busy loop on the core, behind which the probe must show
long waits (RT throttling leaves other tasks 50 ms of each second). Per run: how late its
wake-ups came (max, p99) and the CPU seconds it got. Two runs of each case, alternated.
Writes JSON (default benchmarks/results/autogroup_starvation.json). Run it under the heavy
lock on a machine with at least 2 CPUs (~1.5 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CORE = 1
DURATION_S = 8.0
CASES = (("sched_yield", 2), ("busy", 4))
# the control: one SCHED_FIFO busy loop, which the probe must be seen to wait behind (the
# kernel's RT throttling leaves others 5% of each second: sched_rt_runtime_us)
CONTROL = ("fifo", 1)


def spinner(kind: str, seconds: float) -> None:
    os.sched_setaffinity(0, {CORE})
    if kind == "fifo":
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if kind in ("busy", "fifo"):
            for _ in range(100_000):
                pass
        else:
            for _ in range(1000):
                os.sched_yield()


def probe(seconds: float) -> None:
    os.sched_setaffinity(0, {CORE})
    late: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        time.sleep(0.01)
        late.append(time.monotonic() - t0 - 0.01)
        total = 0
        for i in range(20_000):  # ~1 ms of work
            total += i
    late.sort()
    print(json.dumps({"max_late_s": round(late[-1], 4),
                      "p99_late_s": round(late[int(len(late) * 0.99)], 4),
                      "wakeups": len(late), "cpu_s": round(sum(os.times()[:2]), 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "autogroup_starvation.json"))
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs at least 2 CPUs (the probe and its spinners share core 1)")
    runs = []
    for kind, count in (*CASES, CONTROL):
        for session in (("same", "own", "same", "own") if kind != "fifo" else ("own",)):
            spins = [subprocess.Popen([sys.executable, __file__, "--spinner", kind,
                                       str(DURATION_S + 2)]) for _ in range(count)]
            time.sleep(0.5)
            out = subprocess.run([sys.executable, __file__, "--probe", str(DURATION_S)],
                                 capture_output=True, text=True, check=True,
                                 start_new_session=(session == "own"))
            for s in spins:
                s.wait()
            runs.append({"spinners": kind, "count": count, "session": session,
                         **json.loads(out.stdout)})
            print(runs[-1])
    worst = {f"{kind}_{session}": max(r["max_late_s"] for r in runs
                                      if r["spinners"] == kind and r["session"] == session)
             for kind, _ in CASES for session in ("same", "own")}
    worst["fifo_control_own"] = max(r["max_late_s"] for r in runs if r["spinners"] == "fifo")
    doc = {"core": CORE, "duration_s": DURATION_S,
           "autogroup": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip(),
           "kernel": os.uname().release, "runs": runs, "worst_max_late_s": worst,
           "how": (__doc__ or "").strip()}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(worst))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--spinner":
        spinner(sys.argv[2], float(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--probe":
        probe(float(sys.argv[2]))
    else:
        main()
