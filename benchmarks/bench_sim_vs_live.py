"""The simulator's fidelity on a live deployment: `prfaas sim-vs-live --quick` (48 requests at
0.25 and 0.75 of the planner's capacity) on the native local topology or the vLLM one, as
run K of a series (docs/sim-vs-live.md cites three of each).

Writes benchmarks/results/sim_vs_live/<engine>_run<K>.json: the command's sim_vs_live.json with
the command line, its exit code and its whole wall time (the profile measurement included)
added; run 1 also draws docs/img/sim_vs_live_<engine>.png. A run whose load does not finish in
its time is kept too (its `incomplete` says which load and why). Run it alone on the machine:
live timings are the figure. ~5 min (native) to ~7 min (vLLM) on a 2-core host.

    python benchmarks/bench_sim_vs_live.py --engine native --run 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "sim_vs_live"
TOPOLOGY = {"native": [], "vllm": ["--topology", "topologies/vllm-local.yaml"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(TOPOLOGY), required=True)
    ap.add_argument("--run", type=int, default=1, help="the run's number in its series")
    ap.add_argument("--work", default=str(ROOT / "out" / "sim-vs-live"),
                    help="where the command writes its own files (profile, logs)")
    args = ap.parse_args(argv)
    name = f"{args.engine}_run{args.run}"
    work = Path(args.work) / name
    cmd = [sys.executable, "-m", "prfaas", "sim-vs-live", *TOPOLOGY[args.engine], "--quick",
           "--out", str(work)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    wall = time.perf_counter() - start
    produced = work / "sim_vs_live.json"
    if not produced.exists():
        print(f"{name}: the command wrote no result (exit {done.returncode})", file=sys.stderr)
        return 1
    result = json.loads(produced.read_text())
    shown = ["prfaas", *cmd[3:-1], "DIR"]
    result.update(command=" ".join(shown), exit_code=done.returncode,
                  command_wall_s=round(wall, 1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    if args.run == 1:
        from prfaas.experiments.sim_vs_live.plot import ttft_scatter

        ttft_scatter(result, ROOT / "docs" / "img" / f"sim_vs_live_{args.engine}.png")
    print(f"wrote {out.relative_to(ROOT)} ({wall:.0f} s, exit {done.returncode})")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
