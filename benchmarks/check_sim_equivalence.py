"""Same seed, same results: `prfaas simulate --json` from two source trees on random configs.

Run: python benchmarks/check_sim_equivalence.py REF_SRC [--other SRC] [--cases 20] [--seed 1]
     [--out PATH] [--label TEXT]
  REF_SRC is the reference tree's `src` (e.g. main's checkout before the ranked cluster view);
  the other side is this tree's `src`, or `--other` (two exported commits compared without
  checking either out). Each case draws a scenario scaled to a random instance
  count (1x to 60x the case study's 12), a system, a policy (threshold, cache-aware with trace
  prefix caches, the controller, Mooncake's baselines, TTFT-SLO admission), arrivals, prefill
  order, outages or role rebalancing, and compares the two JSON outputs key by key (wall-clock
  keys dropped). Exit 1 and the differing keys on any difference. Writes
  benchmarks/results/sim_equivalence.json. `--perturb` makes this tree's runs use a different
  seed: the negative control, which must report differences.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
SCENARIOS = SRC / "prfaas/data/scenarios"
OUT = HERE / "results" / "sim_equivalence.json"
WALL = re.compile(r"wall|elapsed|took|_time_s$|seconds_wall", re.I)


def strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if not WALL.search(k)}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += [f"{path}.{k}: missing"] if k not in a or k not in b else diff(
                a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        out = [f"{path}: len {len(a)} != {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def scaled_scenario(base: str, factor: int, folder: Path) -> str:
    raw = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    raw.pop("reference", None)
    for c in raw["clusters"].values():
        c["instances"] *= factor
    for b in raw.get("baselines", {}).values():
        if "instances" in b:
            b["instances"] *= factor
        for part in ("prefill", "decode"):
            if part in b:
                b[part]["instances"] *= factor
    if "gbps" in raw["link"]:
        raw["link"]["gbps"] *= factor
    raw["name"] = f"{base}-x{factor}"
    path = folder / f"{base}-x{factor}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))  # hardware order matters
    return str(path)


def draw(rng: random.Random, folder: Path) -> list[str]:
    factor = rng.choice([1, 1, 2, 5, 10, 25, 60])
    policy = rng.choice(["", "prfaas-threshold", "cache-aware", "cache-aware+controller",
                         "prfaas-threshold+controller", "load-balance", "local-cache-aware",
                         "global-cache-aware", "all-pd", "all-prfaas"])
    base = "paper-case-study"
    argv = []
    if policy.startswith("cache-aware") or "cache" in policy or rng.random() < 0.2:
        base = "mooncake-conversation"
        argv += ["--cache-scope", rng.choice(["global", "cluster", "instance"])]
    argv += ["--scenario", scaled_scenario(base, factor, folder)]
    system = "prfaas_pd" if policy else rng.choice(["prfaas_pd", "homogeneous_pd",
                                                    "naive_heterogeneous"])
    argv += ["--system", system]
    if policy:
        argv += ["--policy", policy]
    # the planner's capacity is ~0.27 req/s per instance of the case study
    rate = round(rng.uniform(0.5, 1.05) * 0.27 * 12 * factor, 2)
    argv += ["--rate", str(rate), "--requests", str(rng.choice([800, 1500, 3000]))]
    argv += ["--arrivals", rng.choice(["uniform", "poisson", "bursty"]),
             "--seed", str(rng.randrange(100))]
    if rng.random() < 0.3:
        argv += ["--prefill-order", "sjf"]
    extra = rng.random()
    if extra < 0.15:
        argv += ["--ttft-slo", str(rng.choice([3, 6, 12]))]
    elif extra < 0.35 and policy in ("", "prfaas-threshold"):
        argv += ["--outage", "link@100+60", "--outage", "prfaas-p0000@50+100",
                 "--outage", "pd-d0001@80+40"]
    elif extra < 0.45 and system == "prfaas_pd" and not policy:
        argv += ["--rebalance"]
    return argv


def run(src: Path, argv: list[str]) -> tuple[dict[str, Any] | None, str]:
    """The summary JSON plus every request's row (requests.csv: its route, instances' times)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "prfaas", "simulate", "--json",
                               "--out", out, *argv],
                              env=env, capture_output=True, text=True, timeout=900)
        if done.returncode:
            return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "rc"
        rows = (Path(out) / "requests.csv").read_text().splitlines()
    return {**strip(json.loads(done.stdout)), "requests_csv": rows}, ""


def compare(args: argparse.Namespace, n: int, perturb: bool) -> list[dict[str, Any]]:
    """`n` drawn cases (the draw sequence of --seed), each run on both sides; with `perturb`
    the other side runs on another seed (the negative control)."""
    rng = random.Random(args.seed)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(n):
            argv = draw(rng, Path(tmp))
            ref, ref_err = run(args.ref_src, argv)
            mine_argv = [*argv, "--seed", "12345"] if perturb else argv
            new, new_err = run(args.other, mine_argv)
            if ref is None or new is None:  # an error on either side counts as a failure
                diffs = [f"error: {ref_err!r} / {new_err!r}"]
            else:
                diffs = diff(ref, new)
            shown = [a if not a.endswith(".yaml") else Path(a).stem for a in argv]
            rows = len(ref["requests_csv"]) - 1 if ref is not None else 0
            print(f"{'control ' if perturb else ''}case {k:2d} "
                  f"{'identical' if not diffs else f'{len(diffs)} differences'}"
                  f" ({rows} request rows): {' '.join(shown)}", flush=True)
            for line in diffs[:5]:
                print("    ", line)
            cases.append({"argv": shown, "identical": not diffs, "differences": len(diffs),
                          "error": ref_err or None, "request_rows": rows})
    return cases


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ref_src", type=Path)
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--perturb", action="store_true")
    ap.add_argument("--control", type=int, default=0, metavar="N",
                    help="then N cases with the other side on another seed, recorded beside")
    ap.add_argument("--other", type=Path, default=SRC, help="the other side's src")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--label", default="", help="what is compared, for the JSON")
    args = ap.parse_args()
    cases = compare(args, args.cases, args.perturb)
    same = sum(c["identical"] for c in cases)
    out: dict[str, Any] = {"label": args.label, "reference": str(args.ref_src),
                           "other": str(args.other), "seed": args.seed,
                           "perturb": args.perturb, "cases": cases, "identical": same,
                           "all_identical": same == len(cases)}
    if args.control:
        control = compare(args, args.control, True)
        out["control"] = {"cases": control,
                          "identical": sum(c["identical"] for c in control)}
        print(f"control: {out['control']['identical']} of {args.control} identical")
    if args.out or not args.perturb:
        (args.out or OUT).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{same} of {args.cases} identical")
    return 0 if same == len(cases) and not (args.control and out["control"]["identical"]) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
