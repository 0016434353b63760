"""`prfaas reproduce --live`: each system of a scenario as a live emulated deployment, its
capacity searched by live probes, beside the simulator on the same topology and scales.

Per system: (1) the simulator's capacity by probe.Search over the probe workloads below, and
its own 4000-request search (sim/capacity.py, a reference); (2) the deployment starts
(emulated.topology) and the same probe.Search runs live. Both searches start at
`LiveOptions.start_rps` (a fixed rate, the same for every system and scenario: neither side is
given the other's answer, nor the planner's), double until a probe is unsustained, then bisect
until the bracket is at most `rel_tol` wide. A probe at rate r has
clamp(r x probe_s, min_requests, max_requests) requests (live seconds), the same workload on
both sides; probe.judge gives the verdict from the same event on both sides: the KV of each
request held by its decoder (simulator: `kv_ready_s`; live: the decode worker's stamp, see
runs.py). (3) TTFT runs at one common load (90% of the smallest simulated capacity) and at
shares of the system's own live capacity, live and simulated on the same workload. Rates and
times are in scenario units (live req/s x time scale, live s / time scale) and in live units;
the mapping is scales.py's.

Near the capacity a short probe's verdict can turn on a request or two, so each side then
judges its bracket again with probes of `confirm_requests` requests (probe.Confirm: the lower
end, then the upper, stepping by the bracket's width where a long probe disagrees); the
capacity reported is the confirmed bracket's lower end, and every probe carries its margin in
requests (probe.judge). `seed` draws other probe workloads and prompts (seed 0: the workloads
of earlier runs). `control_slowdown` (a negative control, never a setting) makes the emulated
workers sleep that factor longer than the profile the router and the simulator use: the live
capacity must fall, the simulator's cannot move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.bench.calibration import per_request_error
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import EmulatedSystem, emulated_system
from prfaas.experiments.probe import Bracket, Confirm, ProbeResult, Search, stats
from prfaas.experiments.runs import RunRecord, deployed, live, probe_workload, simulated
from prfaas.planner.search import plan_all
from prfaas.scenario import Scenario
from prfaas.sim.capacity import find_capacity
from prfaas.workload.arrivals import make_arrivals

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
COMMON_SHARE = 0.9


@dataclass(frozen=True)
class Seeds:
    """The workloads' seeds of one run: seed 0 keeps the earlier runs' probes (0) and TTFT
    runs (1); seed s draws 10 s, 10 s + 1 and 10 s + 2 (confirming probes)."""

    probe: int
    ttft: int
    confirm: int

    @staticmethod
    def of(seed: int) -> Seeds:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, not {seed}")
        return Seeds(10 * seed, 10 * seed + 1, 10 * seed + 2)


@dataclass(frozen=True)
class LiveOptions:
    start_rps: float  # scenario req/s: where both searches start (fixed, never an estimate)
    probe_s: float  # live seconds of arrivals per probe, within the request bounds below
    min_requests: int
    max_requests: int
    ttft_requests: int  # per TTFT run
    max_probes: int
    rel_tol: float  # the bracket's width (unsustained - sustained) / sustained at the end
    own_shares: tuple[float, ...]  # TTFT runs at these shares of the live capacity
    confirm_requests: int = 0  # requests per confirming probe (0: no confirmation)
    confirm_max_probes: int = 8

    def requests_for(self, rate_live_rps: float) -> int:
        return int(min(max(round(rate_live_rps * self.probe_s), self.min_requests),
                       self.max_requests))

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "own_shares": list(self.own_shares)}


# a probe of ~80-240 requests: shorter ones misjudge heavy-tailed systems (homogeneous PD's
# long local prefills) as overloaded at half their capacity (checked on the simulator)
# (checked on the simulator); the bracket is then confirmed with probes 3x the longest
QUICK = LiveOptions(start_rps=1.0, probe_s=16.0, min_requests=80, max_requests=240,
                    ttft_requests=120, max_probes=14, rel_tol=0.02, own_shares=(),
                    confirm_requests=720)
FULL = LiveOptions(start_rps=1.0, probe_s=32.0, min_requests=160, max_requests=480,
                   ttft_requests=240, max_probes=16, rel_tol=0.02, own_shares=(0.9, 0.7),
                   confirm_requests=1440)
STEPS_PER_SYSTEM = 2 + 12 + 3 + 3  # sim, start, ~probes, confirming, TTFT (progress only)


METHOD = {
    "search": "probe.Search on both sides: start at options.start_rps, double until a probe "
              "is unsustained, bisect until (unsustained - sustained) / sustained <= rel_tol; "
              "neither side is given the other's capacity or the planner's",
    "ready": "the request's KV held by its decoder (its first token is then sampled): "
             "simulator kv_ready_s; live the decode worker's wall-clock stamp, on the "
             "client's clock (one host)",
    "sustained": "probe.judge: ready-event throughput in the steady window >= 98% of the "
                 "offered rate, no queue growth, every request completed",
    "confirm": "probe.Confirm on both sides: the short bracket judged again with probes of "
               "options.confirm_requests requests, stepping by its width where they disagree",
    "margin_requests": "per probe, the smallest criterion margin in requests (probe.judge): "
                       ">= 0 sustained by that many, < 0 short by that many",
    "live_capacity_rps": "the confirmed bracket's lower end (scenario units); without "
                         "confirmation the highest sustained live probe"}


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
    if rec.client_ready_s is not None:  # live: the client's first token, for reference
        out["client_ttft_s"] = {k: round(v / a, 4) for k, v in
                                stats(rec.client_ready_s - rec.arrival_s).items()}
    if rec.cpu_share is not None:
        out.update(cpu_share=round(rec.cpu_share, 4), loadavg_1m=rec.loadavg,
                   errors=rec.errors)
    return out


@dataclass(frozen=True)
class SimCapacity:
    """The simulator's side of one system: the short search, its confirmation, the answer and
    the simulator's own 4000-request capacity (live req/s)."""

    search: Search[ProbeResult]
    short: Bracket
    confirm: Confirm[ProbeResult]
    bracket: Bracket
    standard_rps: float


def egress_gbps(rec: RunRecord, sc: Scales) -> float:
    """Mean inter-DC egress over the run, in scenario Gbps (live bytes/s x time / bytes)."""
    return rec.link_bytes * 8 / max(rec.span_s, 1e-9) / 1e9 * sc.time / sc.bytes


class SystemRun:
    def __init__(self, es: EmulatedSystem, options: LiveOptions, tick: Callable[[str], None],
                 log_dir: Path | None, seed: int = 0) -> None:
        self.es, self.options, self.tick, self.log_dir = es, options, tick, log_dir
        self.seeds = Seeds.of(seed)
        s = es.scaled.scenario
        self.lengths, self.out_tokens = s.lengths, s.output_tokens
        self.a = es.scaled.scales.time
        self.start_live_rps = options.start_rps / self.a
        self.pairs: dict[str, tuple[RunRecord, RunRecord]] = {}

    def workload(self, rate: float, seed: int, n: int | None = None) -> Any:
        return probe_workload(self.lengths, self.out_tokens, rate,
                              n or self.options.requests_for(rate), seed)

    def search(self, probe: Callable[[float], ProbeResult]) -> Search:
        o = self.options
        return Search(probe, self.start_live_rps, rel_tol=o.rel_tol, max_probes=o.max_probes)

    def confirmed(self, probe: Callable[[float, int], ProbeResult], short: Bracket
                  ) -> tuple[Confirm, Bracket]:
        """The short bracket judged again with long probes (`probe(rate, n)`); without
        `confirm_requests` nothing is probed and the short bracket stands."""
        n = self.options.confirm_requests
        confirm = Confirm(lambda r: probe(r, n), self.options.rel_tol,
                          self.options.confirm_max_probes if n else 0)
        return confirm, (confirm.run(short) if n else short)

    def sim_capacity(self, planner_rps: float) -> SimCapacity:
        cfg, seeds = self.es.sim_config, self.seeds
        search = self.search(lambda r: simulated(cfg, self.workload(r, seeds.probe)).result)
        short = search.run()
        confirm, bracket = self.confirmed(
            lambda r, n: simulated(cfg, self.workload(r, seeds.confirm, n)).result, short)
        standard = find_capacity(cfg, self.lengths, self.out_tokens,
                                 make_arrivals("uniform"), requests=4000, seed=0,
                                 guess_rps=planner_rps).max_rps
        return SimCapacity(search, short, confirm, bracket, standard)

    def live_phase(self, common_rps: float) -> dict[str, Any]:
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

            seeds = self.seeds
            search = self.search(lambda r: run("probe", r, seeds.probe).result)
            short = search.run()
            _, bracket = self.confirmed(
                lambda r, n: run("confirm", r, seeds.confirm, n).result, short)
            capacity = bracket.sustained_rps or 0.0
            for label, rate in (("common", common_rps),
                                *((f"own{round(100 * f)}", f * capacity)
                                  for f in self.options.own_shares)):
                if rate > 0:
                    rec = run(label, rate, seeds.ttft, self.options.ttft_requests)
                    self.pairs[label] = (rec, runs[-1][2])
        return {"bracket": bracket, "short_bracket": short, "runs": runs}

    def _model_name(self) -> str:
        from prfaas.emulated.backend import emulated_config

        return emulated_config(self.es.scaled).name


def reproduce_live(scenario: Scenario, out_dir: Path, options: LiveOptions,
                   scales: Scales | None = None, tick: Callable[[str], None] = lambda _: None,
                   keep_logs: bool = False, seed: int = 0, control_slowdown: float = 1.0,
                   systems_run: tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    sc = scales or Scales()
    plans = plan_all(scenario, mode="exact")
    systems = {n: SystemRun(emulated_system(scenario, n, sc, control_slowdown=control_slowdown),
                            options, tick, out_dir / "logs" / n if keep_logs else None, seed)
               for n in systems_run}
    sims: dict[str, SimCapacity] = {}
    for name, sr in systems.items():
        sims[name] = sr.sim_capacity(plans.systems[name].lambda_max / sc.time)
        tick(f"{name}: simulated capacity")
    common = COMMON_SHARE * min(v.bracket.sustained_rps or 0.0 for v in sims.values())
    out: dict[str, Any] = {}
    for name, sr in systems.items():
        phase = sr.live_phase(common)
        out[name] = _system_json(sr, phase, sims[name], plans.systems[name].lambda_max, sc)
    result = _result(scenario, sc, options, out, common * sc.time, plans)
    result.update(seed=seed, seeds=vars(Seeds.of(seed)), control_slowdown=control_slowdown)
    return result


def _bracket_json(b: Bracket, a: float) -> list[float | None]:
    return [None if v is None else round(v * a, 5) for v in (b.sustained_rps,
                                                             b.unsustained_rps)]


def _probe_json(p: ProbeResult, a: float) -> dict[str, Any]:
    return {"rate_rps": round(p.rate_rps * a, 5), "sustained": p.sustainable,
            "throughput_rps": round(p.throughput_rps * a, 5),
            "queue_growth": round(p.queue_growth, 3), "completed": p.completed,
            "requests": p.requests, "margin_requests": p.margin_requests,
            "margins": p.margins}


def _paired(rec: RunRecord, srec: RunRecord, a: float) -> dict[str, Any]:
    """A live probe with the simulator's verdict on the very same workload beside it."""
    return {**_probe_json(rec.result, a), "sim_same_workload": {
        "sustained": srec.result.sustainable,
        "throughput_rps": round(srec.result.throughput_rps * a, 5),
        "margin_requests": srec.result.margin_requests}}


def _edges(probes: list[dict[str, Any]], bracket: list[float | None]) -> dict[str, Any]:
    """The margins of the verdicts that decided the bracket: the last probe at each end."""
    out: dict[str, Any] = {}
    for key, rate in zip(("sustained", "unsustained"), bracket, strict=True):
        hits = [p for p in probes if rate is not None and p["rate_rps"] == rate
                and p["sustained"] == (key == "sustained")]
        out[key] = None if not hits else {"rate_rps": rate, "requests": hits[-1]["requests"],
                                          "margin_requests": hits[-1]["margin_requests"]}
    return out


def _system_json(sr: SystemRun, phase: dict[str, Any], sim: SimCapacity,
                 planner_rps: float, sc: Scales) -> dict[str, Any]:
    a = sc.time
    bracket: Bracket = phase["bracket"]
    cap, sim_cap = bracket.sustained_rps, sim.bracket.sustained_rps
    ttft = {}
    for label, (rec, srec) in sr.pairs.items():
        ttft[label] = {"live": _run_json(rec, a), "sim": _run_json(srec, a),
                       "live_egress_gbps": round(egress_gbps(rec, sc), 3),
                       "sim_egress_gbps": round(egress_gbps(srec, sc), 3)}
    runs = [{"kind": label, "live": _run_json(rec, a), "sim": _run_json(srec, a)}
            for label, rec, srec in phase["runs"]]
    probes = [_paired(rec, srec, a) for label, rec, srec in phase["runs"] if label == "probe"]
    confirm = [_paired(rec, srec, a) for label, rec, srec in phase["runs"]
               if label == "confirm"]
    sim_probes = [_probe_json(p, a) for p in sim.search.probes]
    sim_confirm = [_probe_json(p, a) for p in sim.confirm.probes]
    live_b, sim_b = _bracket_json(bracket, a), _bracket_json(sim.bracket, a)
    return {
        "live_capacity_rps": None if cap is None else round(cap * a, 4),
        "live_capacity_live_rps": None if cap is None else round(cap, 4),
        "bracket_rps": live_b,
        "bracket_width": None if bracket.width is None else round(bracket.width, 4),
        "converged": bracket.converged, "probes": probes,
        "short_bracket_rps": _bracket_json(phase["short_bracket"], a),
        "confirm_probes": confirm,
        "bracket_margins": _edges(confirm or probes, live_b),
        "sim_capacity_rps": None if sim_cap is None else round(sim_cap * a, 4),
        "sim_bracket_rps": sim_b,
        "sim_bracket_width": None if sim.bracket.width is None else round(sim.bracket.width, 4),
        "sim_converged": sim.bracket.converged,
        "sim_probes": sim_probes,
        "sim_short_bracket_rps": _bracket_json(sim.short, a),
        "sim_confirm_probes": sim_confirm,
        "sim_bracket_margins": _edges(sim_confirm or sim_probes, sim_b),
        "sim_capacity_4000_rps": round(sim.standard_rps * a, 4),
        "planner_exact_rps": round(planner_rps, 4),
        "live_over_sim": round(cap / sim_cap, 4) if cap and sim_cap else None,
        "topology": {"workers": len(sr.es.topology.workers),
                     "link": sr.es.topology.link.emulation,
                     "link_gbps_live": sr.es.topology.link.rate_gbps,
                     "policy": sr.es.topology.policy, "policy_args": sr.es.topology.policy_args},
        "sim_config": sr.es.sim_config.describe(),
        "ttft_common": ttft.get("common"), "ttft_own90": ttft.get("own90"),
        "ttft_own70": ttft.get("own70"), "runs": runs,
        "max_cpu_share": max((r["live"].get("cpu_share", 0.0) for r in runs), default=None),
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
    base = systems.get("homogeneous_pd", {})

    def ratios(key: str) -> dict[str, float | None]:
        return {n: round(v[key] / base[key], 4) if v[key] and base.get(key) else None
                for n, v in systems.items()}

    ratio, sim_ratio = ratios("live_capacity_rps"), ratios("sim_capacity_rps")
    return {"scenario": scenario.name, "backend": "emulated", "scales": sc.to_json(),
            "options": options.to_json(), "common_rps": round(common_rps, 4),
            "live_ratio": ratio.get("prfaas_pd"), "live_ratios": ratio,
            "sim_ratios": sim_ratio,
            "method": METHOD, "systems": systems,
            "units": "rates in scenario req/s (live x time scale), times in scenario s "
                     "(live / time scale), egress in scenario Gbps"}
