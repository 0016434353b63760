"""`prfaas reproduce --live`: each system of a scenario as a live emulated deployment, its
capacity searched by live probes, beside the simulator on the same topology and scales.

Per system: (1) the simulator's capacity with the live protocol (probe.Search over the same
probe workloads, probe.judge) and with the simulator's own 4000-request search
(sim/capacity.py); (2) the deployment starts (emulated.topology) and a live search runs from
the simulator's figure (it only sets where the search starts; every verdict is live);
(3) TTFT runs at one common load (90% of the smallest simulated capacity), at 90% and at 70%
of the system's own live capacity, each run live and simulated on the same workload. Rates and
times are reported in scenario units (live req/s x time scale, live s / time scale) and in live
units; the mapping is scales.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.bench.calibration import per_request_error
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import EmulatedSystem, emulated_system
from prfaas.experiments.probe import Search
from prfaas.experiments.runs import RunRecord, deployed, live, probe_workload, simulated
from prfaas.planner.search import plan_all
from prfaas.scenario import Scenario
from prfaas.sim.capacity import find_capacity
from prfaas.workload.arrivals import make_arrivals

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
COMMON_SHARE, OWN_SHARES = 0.9, (0.9, 0.7)
PROBE_SEED, TTFT_SEED = 0, 1


@dataclass(frozen=True)
class LiveOptions:
    requests: int  # per capacity probe
    ttft_requests: int  # per TTFT run
    max_probes: int
    rel_tol: float
    step: float = 1.06

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


QUICK = LiveOptions(requests=240, ttft_requests=120, max_probes=5, rel_tol=0.04)
FULL = LiveOptions(requests=480, ttft_requests=240, max_probes=8, rel_tol=0.02)
STEPS_PER_SYSTEM = 2 + QUICK.max_probes + 3  # sim, start, probes, TTFT runs (progress only)


def _run_json(rec: RunRecord, a: float) -> dict[str, Any]:
    """A run in scenario units (times / a, rates x a)."""
    r = rec.result
    out = {"offered_rps": round(r.rate_rps * a, 5), "throughput_rps":
           round(r.throughput_rps * a, 5), "sustainable": r.sustainable,
           "queue_growth": round(r.queue_growth, 3), "completed": r.completed,
           "requests": r.requests,
           "ttft_s": {k: round(v / a, 4) for k, v in r.ttft_s.items()},
           "e2e_s": {k: round(v / a, 4) for k, v in r.e2e_s.items()},
           "offload_fraction": round(float(rec.remote.mean()), 4)}
    if rec.cpu_share is not None:
        out.update(cpu_share=round(rec.cpu_share, 4), loadavg_1m=rec.loadavg,
                   errors=rec.errors)
    return out


def egress_gbps(rec: RunRecord, sc: Scales) -> float:
    """Mean inter-DC egress over the run, in scenario Gbps (live bytes/s x time / bytes)."""
    return rec.link_bytes * 8 / max(rec.span_s, 1e-9) / 1e9 * sc.time / sc.bytes


class SystemRun:
    def __init__(self, es: EmulatedSystem, options: LiveOptions, tick: Callable[[str], None],
                 log_dir: Path | None) -> None:
        self.es, self.options, self.tick, self.log_dir = es, options, tick, log_dir
        s = es.scaled.scenario
        self.lengths, self.out_tokens = s.lengths, s.output_tokens
        self.a = es.scaled.scales.time
        self.pairs: dict[str, tuple[RunRecord, RunRecord]] = {}

    def workload(self, rate: float, seed: int, n: int | None = None) -> Any:
        return probe_workload(self.lengths, self.out_tokens, rate, n or self.options.requests,
                              seed)

    def sim_capacity(self, guess: float) -> tuple[float, list[Any], float]:
        search = Search(lambda r: simulated(self.es.sim_config, self.workload(r, PROBE_SEED)
                                            ).result, guess, step=1.08, rel_tol=0.005,
                        max_probes=24)
        same = search.run()
        standard = find_capacity(self.es.sim_config, self.lengths, self.out_tokens,
                                 make_arrivals("uniform"), requests=4000, seed=0,
                                 guess_rps=guess).max_rps
        return same, search.probes, standard

    def live_phase(self, start_rps: float, common_rps: float) -> dict[str, Any]:
        with deployed(self.es.topology, self.log_dir) as dep:
            self.tick(f"{self.es.system}: deployment up")
            pids = [p.pid for p in dep.procs.values()]
            model = self._model_name()
            runs: list[tuple[str, RunRecord, RunRecord]] = []

            def run(label: str, rate: float, seed: int, n: int | None = None) -> RunRecord:
                w = self.workload(rate, seed, n)
                rec = live(dep.url, model, w, pids, seed + 7)
                sim = simulated(self.es.sim_config, w)
                runs.append((label, rec, sim))
                r = rec.result
                self.tick(f"{self.es.system}: {label} {rate * self.a:.3f} req/s -> "
                          f"{'ok' if r.sustainable else 'over'}")
                return rec

            search = Search(lambda r: run("probe", r, PROBE_SEED).result, start_rps,
                            step=self.options.step, rel_tol=self.options.rel_tol,
                            max_probes=self.options.max_probes)
            capacity = search.run()
            for label, rate in (("common", common_rps),
                                *((f"own{round(100 * f)}", f * capacity) for f in OWN_SHARES)):
                if rate > 0:
                    rec = run(label, rate, TTFT_SEED, self.options.ttft_requests)
                    self.pairs[label] = (rec, runs[-1][2])
        return {"capacity_live_rps": capacity, "runs": runs}

    def _model_name(self) -> str:
        from prfaas.emulated.backend import emulated_config

        return emulated_config(self.es.scaled).name


def reproduce_live(scenario: Scenario, out_dir: Path, options: LiveOptions,
                   scales: Scales | None = None, tick: Callable[[str], None] = lambda _: None,
                   keep_logs: bool = False) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    sc = scales or Scales()
    plans = plan_all(scenario, mode="exact")
    systems = {n: SystemRun(emulated_system(scenario, n, sc), options, tick,
                            out_dir / "logs" / n if keep_logs else None) for n in SYSTEMS}
    sims: dict[str, tuple[float, list[Any], float]] = {}
    for name, sr in systems.items():
        sims[name] = sr.sim_capacity(plans.systems[name].lambda_max / sc.time)
        tick(f"{name}: simulated capacity")
    common = COMMON_SHARE * min(v[0] for v in sims.values())
    out: dict[str, Any] = {}
    for name, sr in systems.items():
        phase = sr.live_phase(sims[name][0], common)
        out[name] = _system_json(sr, phase, sims[name], plans.systems[name].lambda_max, sc)
    return _result(scenario, sc, options, out, common * sc.time, plans)


def _system_json(sr: SystemRun, phase: dict[str, Any], sim: tuple[float, list[Any], float],
                 planner_rps: float, sc: Scales) -> dict[str, Any]:
    a = sc.time
    cap = phase["capacity_live_rps"]
    ttft = {}
    for label, (rec, srec) in sr.pairs.items():
        ttft[label] = {"live": _run_json(rec, a), "sim": _run_json(srec, a),
                       "live_egress_gbps": round(egress_gbps(rec, sc), 3),
                       "sim_egress_gbps": round(egress_gbps(srec, sc), 3)}
    probes = [{"kind": label, "live": _run_json(rec, a), "sim": _run_json(srec, a)}
              for label, rec, srec in phase["runs"]]
    return {
        "live_capacity_rps": round(cap * a, 4), "live_capacity_live_rps": round(cap, 4),
        "sim_capacity_rps": round(sim[0] * a, 4), "sim_capacity_4000_rps": round(sim[2] * a, 4),
        "planner_exact_rps": round(planner_rps, 4),
        "live_over_sim": round(cap / sim[0], 4) if sim[0] else None,
        "topology": {"workers": len(sr.es.topology.workers),
                     "link": sr.es.topology.link.emulation,
                     "link_gbps_live": sr.es.topology.link.rate_gbps,
                     "policy": sr.es.topology.policy, "policy_args": sr.es.topology.policy_args},
        "sim_config": sr.es.sim_config.describe(),
        "ttft_common": ttft.get("common"), "ttft_own90": ttft.get("own90"),
        "ttft_own70": ttft.get("own70"),
        "sim_probes": [p.to_json() for p in sim[1]], "runs": probes,
        "max_cpu_share": max((r["live"].get("cpu_share", 0.0) for r in probes), default=None),
        "calibration": calibration(sr.pairs, a),
    }


def calibration(pairs: dict[str, tuple[RunRecord, RunRecord]], a: float) -> dict[str, Any]:
    """Per-request error of the simulator against the live run (same workload), per TTFT
    run: TTFT and E2E (bench/calibration.py), P50/P90 values in scenario seconds."""
    return {label: {"ttft": per_request_error(rec.ready_s - rec.arrival_s,
                                              srec.ready_s - srec.arrival_s, a),
                    "e2e": per_request_error(rec.finish_s - rec.arrival_s,
                                             srec.finish_s - srec.arrival_s, a)}
            for label, (rec, srec) in pairs.items()}


def _result(scenario: Scenario, sc: Scales, options: LiveOptions, systems: dict[str, Any],
            common_rps: float, plans: Any) -> dict[str, Any]:
    base = systems["homogeneous_pd"]
    ratio = {n: round(v["live_capacity_rps"] / base["live_capacity_rps"], 4)
             if base["live_capacity_rps"] else None for n, v in systems.items()}
    sim_ratio = {n: round(v["sim_capacity_rps"] / base["sim_capacity_rps"], 4)
                 for n, v in systems.items()}
    return {"scenario": scenario.name, "backend": "emulated", "scales": sc.to_json(),
            "options": options.to_json(), "common_rps": round(common_rps, 4),
            "live_ratio": ratio["prfaas_pd"], "live_ratios": ratio, "sim_ratios": sim_ratio,
            "systems": systems,
            "units": "rates in scenario req/s (live x time scale), times in scenario s "
                     "(live / time scale), egress in scenario Gbps"}
