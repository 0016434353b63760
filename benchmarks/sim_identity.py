"""Is the simulator's output unchanged by a change? Hashes of every output file of a fixed matrix
of `prfaas simulate` runs, captured from two source trees, then compared.

    python benchmarks/sim_identity.py capture --src TREE/src --out A.json [--label L]
    python benchmarks/sim_identity.py compare A.json B.json [--out RESULT.json]

`capture` runs `python -m prfaas simulate --scenario S --system Y --arrivals A --seed 7
--duration D --json --out DIR` with PYTHONPATH=TREE/src for every one-cluster scenario shipped
in that tree x the three systems x uniform, poisson and bursty arrivals (D = 600 simulated s,
120 s for datacenter-10k), and records the SHA-256 of three files per run: the `--json` output
with its wall-clock key (`sim_wall_s`) dropped, `result.json` and `requests.csv` (`timing.json`
is wall-clock by design and left out). A run that fails is recorded with its error, and
`compare` counts it as a difference. `compare` prints and writes how many files are identical,
which differ, and which runs exist on one side only; it exits 1 on any difference. The
negative control is a capture with another `--seed`, which must differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
ARRIVALS = ("uniform", "poisson", "bursty")
DURATION_S, LARGE_DURATION_S = 600.0, 120.0
LARGE = {"datacenter-10k"}  # ~1,250 instances: a shorter run
WALL_KEYS = {"sim_wall_s"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scenarios(src: Path) -> list[str]:
    """The tree's shipped scenarios with one PD cluster (a multi-cluster one runs another
    simulator, without systems or arrival choices)."""
    folder = src / "prfaas" / "data" / "scenarios"
    return sorted(p.stem for p in folder.glob("*.yaml")
                  if "pd_clusters" not in (yaml.safe_load(p.read_text()) or {}))


def one_run(src: Path, scenario: str, system: str, arrivals: str, seed: int) -> dict[str, Any]:
    duration = LARGE_DURATION_S if scenario in LARGE else DURATION_S
    argv = ["--scenario", scenario, "--system", system, "--arrivals", arrivals, "--seed",
            str(seed), "--duration", f"{duration:g}", "--json"]
    with tempfile.TemporaryDirectory(prefix="sim-identity-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(src)}
        done = subprocess.run([sys.executable, "-m", "prfaas", "simulate", *argv, "--out", tmp],
                              capture_output=True, env=env, timeout=1800, check=False)
        if done.returncode != 0:
            return {"argv": argv, "error": done.stderr.decode(errors="replace")[-400:]}
        summary = {k: v for k, v in json.loads(done.stdout).items() if k not in WALL_KEYS}
        files = {"json": sha(json.dumps(summary, sort_keys=True).encode()),
                 "result.json": sha((Path(tmp) / "result.json").read_bytes()),
                 "requests.csv": sha((Path(tmp) / "requests.csv").read_bytes())}
    return {"argv": argv, "files": files}


def capture(src: Path, out: Path, seed: int, label: str) -> None:
    t0 = time.perf_counter()
    runs = {}
    for scenario in scenarios(src):
        for system in SYSTEMS:
            for arrivals in ARRIVALS:
                key = f"{scenario}/{system}/{arrivals}"
                runs[key] = one_run(src, scenario, system, arrivals, seed)
                print(f"{key}: {'error' if 'error' in runs[key] else 'ok'}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"label": label, "seed": seed, "runs": runs,
                               "wall_s": round(time.perf_counter() - t0, 1)}, indent=1) + "\n")


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    identical, differing = 0, []
    for key in sorted(set(a["runs"]) & set(b["runs"])):
        fa, fb = a["runs"][key].get("files"), b["runs"][key].get("files")
        if fa is None or fb is None:
            differing.append(f"{key}: error on {'the first' if fa is None else 'the second'}")
            continue
        for name in sorted(set(fa) | set(fb)):
            if fa.get(name) == fb.get(name):
                identical += 1
            else:
                differing.append(f"{key}/{name}")
    only = sorted(set(a["runs"]) ^ set(b["runs"]))
    return {"a": a["label"], "b": b["label"], "seeds": [a["seed"], b["seed"]],
            "runs_compared": len(set(a["runs"]) & set(b["runs"])), "files_identical": identical,
            "files_differing": len(differing), "differing": differing, "one_side_only": only}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("--src", type=Path, required=True, help="a source tree's src folder")
    cap.add_argument("--out", type=Path, required=True)
    cap.add_argument("--seed", type=int, default=7)
    cap.add_argument("--label", default="")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    cmp_.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "capture":
        capture(args.src.resolve(), args.out, args.seed, args.label or str(args.src))
        return 0
    result = compare(json.loads(args.a.read_text()), json.loads(args.b.read_text()))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['files_identical']} files identical, {result['files_differing']} differ "
          f"over {result['runs_compared']} runs; {len(result['one_side_only'])} on one side only")
    for line in result["differing"][:20]:
        print(f"  differs: {line}")
    return 1 if result["files_differing"] or result["one_side_only"] else 0


if __name__ == "__main__":
    sys.exit(main())
