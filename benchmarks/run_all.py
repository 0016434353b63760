"""Run every benchmark under benchmarks/ in turn (`make bench`); each writes its own JSON
under benchmarks/results/. Takes ~15-20 minutes on 2 cores; run on a quiet machine, since
several benchmarks compare ratios measured within one run."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["bench_planner.py", "bench_sim.py", "bench_cache.py", "bench_transport.py",
         "bench_pipelining.py", "bench_engine.py", "bench_policies.py", "bench_serve.py",
         "bench_sim_vs_live.py"]


def main() -> int:
    missing = sorted({p.name for p in HERE.glob("bench_*.py")} - set(ORDER))
    failed = []
    for name in ORDER + missing:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / name)], check=False)
        print(f"== {name}: exit {done.returncode} in {time.perf_counter() - start:.0f} s",
              flush=True)
        if done.returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
