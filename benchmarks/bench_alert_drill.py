"""The alert drill (experiments/alert_drill.py) once, recorded: which alerts fired for a cut
inter-DC link and a killed worker, when, and when they resolved, on the embedded local.yaml
deployment with Debian's prometheus and the shipped rules at 1/30 of their durations.
Needs the prometheus binary (`make prometheus`), root and iproute2.

    python benchmarks/bench_alert_drill.py [--out benchmarks/results/alert_drill.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from prfaas.experiments.alert_drill import run_drill, verdict

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/alert_drill.json"))
    args = ap.parse_args()
    rules = (REPO / "deploy/prometheus/prfaas-rules.yml").read_text()
    result = run_drill(rules, log=print)
    problems = verdict(result)
    result.update({"problems": problems, "ok": not problems, "backend": "native",
                   "host": f"{os.cpu_count()}-core {platform.machine()} host, shared by the "
                           "deployment's processes and Prometheus",
                   "date": time.strftime("%Y-%m-%d")})
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ok": result["ok"], "problems": problems, "wall_s": result["wall_s"]}))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
