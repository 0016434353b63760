"""Simulator speed: the case-study hour, growth with requests, growth with instances, and the
whole-process wall time of the two commands users run in loops.

Run: .venv/bin/python benchmarks/bench_sim.py [--baseline REF] [--startup-only]
  -> benchmarks/results/sim.json
Wall time is the event loop only (Simulator.run), best of `REPEATS`, one process (one core).
Growth with instances: the 4/3/5 mix, rate and link scaled together, 10 simulated minutes,
routing over the k = 8 least-loaded of each pool (SimView candidate_limit).
`startup`: `prfaas plan --scenario paper-case-study` and `prfaas simulate --scenario
paper-case-study --system prfaas_pd --requests 10000` as whole processes (and the bare import
of their modules), beside the work they report (plan search ms, simulator loop s); with
`--baseline REF` the same commands run from that commit's source tree in the same run, so
before/after share one machine state. `--startup-only` measures only that and updates the
`startup` key of sim.json.

`--scale` (alone: updates only the `scale_curve` key): 12, 125, 1,250 and 2,500 instances of
the 4/3/5 mix at the same load per instance, 20,000 Poisson requests each at 90% of the
planner's capacity (rate and link scaled with the instances), each point in a fresh process
(wall of Simulator.run, peak RSS of that process); with `--scale-baseline SRC` the same points
also run from another source tree (e.g. main's, before the ranked cluster view), point by point
in turn. Plot: docs/img/sim_scale.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prfaas.scenario import load_scenario
from prfaas.sim.link import LinkSchedule
from prfaas.sim.simulator import Simulator
from prfaas.sim.system import SystemConfig, build_system
from prfaas.workload.arrivals import make_arrivals
from prfaas.workload.requests import synthetic

REPEATS = 3
PROCESS_REPEATS = 5
OUT = Path(__file__).parent / "results" / "sim.json"
REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    "plan": (["plan", "--scenario", "paper-case-study"], r"points in ([0-9.]+) ms", 1e-3),
    "simulate": (["simulate", "--scenario", "paper-case-study", "--system", "prfaas_pd",
                  "--requests", "10000"], r"events in ([0-9.]+) s wall", 1.0),
}


def timed(cfg: SystemConfig, rate: float, n: int, limit: int | None = None,
          repeats: int = REPEATS) -> dict[str, float]:
    s = load_scenario("paper-case-study")
    w = synthetic(s.lengths, s.output_tokens, make_arrivals("uniform"), rate, n, seed=0)
    best = float("inf")
    events = 0
    for _ in range(repeats):
        start = time.perf_counter()
        sim = Simulator(cfg, w, candidate_limit=limit).run()
        best = min(best, time.perf_counter() - start)
        events = sim.events
    return {"requests": n, "rate_rps": rate, "simulated_s": round(sim.now_s, 1),
            "wall_s": round(best, 4), "events": events,
            "events_per_s": round(events / best), "requests_per_wall_s": round(n / best)}


def scaled(cfg: SystemConfig, instances: int) -> SystemConfig:
    """The 4/3/5 prfaas_pd mix and the link scaled to `instances` instances in all."""
    n_prfaas = round(instances * 4 / 12)
    n_p = round(instances * 3 / 12)
    return replace(cfg, n_prfaas=n_prfaas, n_p=n_p, n_d=instances - n_prfaas - n_p,
                   link=LinkSchedule.constant(cfg.link.gbps[0] * instances / 12))


def _process_s(argv: list[str], src: Path) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "130"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                          check=True, timeout=600)
    return time.perf_counter() - start, done.stdout


def process_times(sources: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Per source tree and command: whole-process wall (best and median of PROCESS_REPEATS),
    the bare import, and the work the command reports (best). The trees take turns within
    each repeat, so a change of machine load hits before and after alike."""
    samples: dict[tuple[str, str], dict[str, list[float]]] = {
        (tree, name): {"wall": [], "import": [], "work": []}
        for tree in sources for name in COMMANDS}
    for _ in range(PROCESS_REPEATS):
        for name, (args, pattern, unit) in COMMANDS.items():
            for tree, src in sources.items():
                got = samples[(tree, name)]
                wall, text = _process_s(["-m", "prfaas", *args], src)
                got["wall"].append(wall)
                found = re.search(pattern, text.replace(",", ""))
                if found:
                    got["work"].append(float(found.group(1)) * unit)
                got["import"].append(_process_s(["-c", f"import prfaas.cli.{name}"], src)[0])
    out: dict[str, dict[str, Any]] = {tree: {} for tree in sources}
    for (tree, name), got in samples.items():
        wall, work = min(got["wall"]), min(got["work"]) if got["work"] else None
        out[tree][name] = {
            "command": "prfaas " + " ".join(COMMANDS[name][0]),
            "process_wall_s": round(wall, 3),
            "process_wall_median_s": round(statistics.median(got["wall"]), 3),
            "import_process_s": round(min(got["import"]), 3),
            "work_s": None if work is None else round(work, 3),
            "outside_work_s": None if work is None else round(wall - work, 3)}
    return out


def startup(baseline: str | None) -> dict[str, Any]:
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "how": f"whole process = `python -m prfaas ...` wall, best (and median) of "
               f"{PROCESS_REPEATS}, before and after taking turns; import_process = "
               "`python -c 'import prfaas.cli.X'`; work = the plan search time / simulator "
               "loop time the command prints; outside_work = process - work (interpreter, "
               "imports, scenario, plan, output)",
        "python_bare_s": round(min(_process_s(["-c", "pass"], REPO)[0] for _ in range(3)), 3)}
    sources = {"after": REPO / "src"}
    with tempfile.TemporaryDirectory() as tmp:
        if baseline is not None:
            commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", baseline],
                                    capture_output=True, text=True, check=True).stdout.strip()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            sources["before"] = Path(tmp) / "src"
            result["before_commit"] = commit
        result.update(process_times(sources))
    result["load_average"] = {"before": [round(x, 2) for x in load_before],
                              "after": [round(x, 2) for x in os.getloadavg()]}
    return result


SCALE_POINTS = (12, 125, 1250, 2500)
SCALE_REQUESTS = 20000
PLOT = REPO / "docs" / "img" / "sim_scale.png"
_POINT = """
import json, resource, sys, time
sys.path.insert(0, {bench!r})
from bench_sim import scaled_point
print(json.dumps(scaled_point({inst}, {n})))
"""


def scaled_point(instances: int, requests: int) -> dict[str, Any]:
    """One scale point, run in this process (see `--scale`)."""
    import resource

    from prfaas.planner.search import plan_all

    s = load_scenario("paper-case-study")
    planned = plan_all(s, mode="exact")
    cfg = scaled(build_system(s, "prfaas_pd", planned=planned), instances)
    rate = 0.9 * planned.systems["prfaas_pd"].lambda_max * instances / 12
    w = synthetic(s.lengths, s.output_tokens, make_arrivals("poisson"), rate, requests, seed=0)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    sim = Simulator(cfg, w).run()
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"instances": instances, "n_prfaas": cfg.n_prfaas, "n_p": cfg.n_p, "n_d": cfg.n_d,
            "requests": requests, "rate_rps": round(rate, 3), "simulated_s": round(sim.now_s, 1),
            "events": sim.events, "wall_s": round(wall, 3),
            "wall_per_request_us": round(wall / requests * 1e6, 1),
            "peak_rss_mib": round(rss / 1024, 1),
            "peak_rss_before_sim_mib": round(rss_before / 1024, 1)}


def scale_curve(baseline_src: Path | None, earlier_before: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """With no `baseline_src`, `earlier_before` (the last run's `before`) is kept as it was,
    marked as not re-timed."""
    trees = {"after": REPO / "src"}
    if baseline_src is not None:
        trees["before"] = baseline_src
    rows: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    load_before = os.getloadavg()
    for inst in SCALE_POINTS:
        for tree, src in trees.items():
            code = _POINT.format(bench=str(Path(__file__).parent), inst=inst, n=SCALE_REQUESTS)
            env = {**os.environ, "PYTHONPATH": str(src)}
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, check=True, timeout=3600)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows[tree].append(row)
            print(tree, row, flush=True)
    after = {r["instances"]: r for r in rows["after"]}
    result: dict[str, Any] = {
        "how": f"4/3/5 prfaas_pd mix of the paper case study scaled to each instance count "
               f"(rate = 0.9 x the exact planner's capacity x instances / 12, link 100 Gbps "
               f"per 12 instances), {SCALE_REQUESTS:,} Poisson requests, seed 0, each point "
               "a fresh process; wall = Simulator.run; peak RSS of the whole process",
        "machine": f"{platform.processor() or platform.machine()}, python "
                   f"{platform.python_version()}, shared 2-core VM (other engineers' work ran "
                   "beside it; timing runs held /work/heavy.lock)",
        "points": rows["after"],
        "ratio_1250_to_12": round(after[1250]["wall_per_request_us"]
                                  / after[12]["wall_per_request_us"], 2),
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }
    if "before" in rows:
        result["before"] = {"source": str(baseline_src), "points": rows["before"]}
    elif earlier_before is not None:
        result["before"] = {**earlier_before, "kept": "from an earlier run, not re-timed"}
    plot_scale(result)
    return result


def plot_scale(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    series = [("ranked view (after)", result["points"])]
    if "before" in result:
        series.append(("full scan (before)", result["before"]["points"]))
    for label, points in series:
        ax.plot([p["instances"] for p in points], [p["wall_per_request_us"] for p in points],
                marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("instances (4/3/5 mix, same load per instance)")
    ax.set_ylabel("wall per simulated request (us)")
    ax.set_title("Simulator cost per request vs cluster size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="commit to time as `before`")
    parser.add_argument("--startup-only", action="store_true")
    parser.add_argument("--scale", action="store_true", help="only the scale curve")
    parser.add_argument("--scale-baseline", type=Path, default=None,
                        help="a source tree (src/) to run the scale curve from as `before`")
    args = parser.parse_args()
    if args.scale:
        previous = json.loads(OUT.read_text()) if OUT.exists() else {}
        curve = scale_curve(args.scale_baseline, previous.get("scale_curve", {}).get("before"))
        OUT.write_text(json.dumps({**previous, "scale_curve": curve}, indent=2) + "\n")
        print(f"wrote {OUT} (scale curve), {PLOT}")
        return
    start = startup(args.baseline)
    print("startup", json.dumps(start, indent=2))
    if args.startup_only:
        previous = json.loads(OUT.read_text()) if OUT.exists() else {}
        OUT.write_text(json.dumps({**previous, "startup": start}, indent=2) + "\n")
        print(f"wrote {OUT} (startup only)")
        return
    s = load_scenario("paper-case-study")
    cfg = build_system(s, "prfaas_pd")
    hour = timed(cfg, 3.0, 10800)
    print("case-study hour", hour)
    by_requests = [timed(cfg, 3.0, n) for n in (2700, 5400, 10800, 21600)]
    print("by requests", by_requests)
    by_instances = []
    for inst in (12, 48, 192, 480, 1250):
        rate = 3.0 * inst / 12
        row = timed(scaled(cfg, inst), rate, int(rate * 600), limit=8,
                    repeats=1 if inst > 200 else REPEATS)
        row["instances"] = inst
        by_instances.append(row)
        print("instances", row)
    result = {
        "how": "prfaas_pd of the paper case study (t from the exact planner), uniform arrivals, "
               "1024-token outputs, seed 0; wall = Simulator.run only, best of 3 (1 run for "
               ">200 instances), single process; scale runs use SimView candidate_limit=8 and "
               "10 simulated minutes at 3.0 req/s and 100 Gbps of link per 12 instances",
        "machine": f"{platform.processor() or platform.machine()}, python "
                   f"{platform.python_version()}, shared 2-core VM (noisy)",
        "routing_index": "candidate_limit reads the k least-loaded instances from a per-pool "
                         "lazy heap (sim/load_index.py), O(k log n) per decision; before it "
                         "(commit 09a88c7, heapq.nsmallest over the whole pool) the 1,250-"
                         "instance run took 122.97 s (1,525 req/s), 192 instances 3.93 s",
        "case_study_hour": hour,
        "by_requests": by_requests,
        "by_instances_10min": by_instances,
        "startup": start,
        "scale_curve": scale_curve(None),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
