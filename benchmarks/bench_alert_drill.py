"""The alert drill (experiments/alert_drill.py) once, recorded: which alerts fired for a cut
inter-DC link and a killed worker, when, and when they resolved, on the embedded local.yaml
deployment with Debian's prometheus and the shipped rules at 1/30 of their durations.
Needs the prometheus binary (`make prometheus`), root and iproute2. The same drill runs in
`make test` (tests/monitoring/test_alerts_live.py, which records it too when
PRFAAS_ALERT_DRILL_OUT names a file).

    python benchmarks/bench_alert_drill.py [--out benchmarks/results/alert_drill.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prfaas.experiments.alert_drill import record, run_drill

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/alert_drill.json"))
    args = ap.parse_args()
    rules = (REPO / "deploy/prometheus/prfaas-rules.yml").read_text()
    out = record(run_drill(rules, log=print), args.out)
    print(json.dumps({"ok": out["ok"], "problems": out["problems"], "wall_s": out["wall_s"]}))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
