"""Assemble a simulated system (`prfaas_pd`, `homogeneous_pd`, `naive_heterogeneous`) from a
scenario, the planner's optimum and any overrides.

- prfaas_pd: N_prfaas PrfaaS prefill instances (remote: KV crosses the inter-cluster link),
  N_p local PD-P and N_d PD-D instances of the PD cluster; router `prfaas-threshold` with t.
- homogeneous_pd: the homogeneous pool split N_p / N_d; router `all-pd`.
- naive_heterogeneous: every prefill on the naive prefill pool (remote), decode on the naive
  decode pool; router `all-prfaas`.

Link: `scenario.link_gbps`, or the scenario's `link.schedule` ([[start_s, gbps], ...] or
[{start_s, gbps}, ...]), the per-transfer cap and RTT of its TCP path (`scenario.tcp`:
`connections` x min(`per_connection_gbps`, Mathis' bound from `rtt_ms`/`loss`/`mss_bytes`),
models/tcp.py) and `pipelined` (default true). Intra-cluster transfers run at `intra_gbps`,
unshared. `max_queued_per_prefill` (an override; default none) bounds each prefill queue as the
live router's `admission.max_queued_per_prefill` does: a request beyond it spills to the other
route, or is rejected when both are full (policy/spill.py). `core_groups` / `core_share_factor`
(overrides; default none): prefill instances that share cores (sim/sharing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.models.kv_release import KvRelease
from prfaas.models.profile import DecodeTime, KVSize, PrefillTime
from prfaas.models.profile_file import check_core_share_factor
from prfaas.scenario import LINK_ORDERS, Scenario
from prfaas.sim.instances import PREFILL_ORDERS
from prfaas.sim.link import LinkSchedule

if TYPE_CHECKING:
    from prfaas.planner.search import PlanResult

SYSTEMS = ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous")
DEFAULT_KV_LAYERS = 64  # used for the last layer's share when the scenario names no model


@dataclass(frozen=True)
class SystemConfig:
    system: str
    router: str
    threshold_tokens: int | None
    n_prfaas: int  # remote prefill instances (0 for homogeneous_pd)
    n_p: int  # local prefill instances (0 for naive_heterogeneous)
    n_d: int
    prfaas_prefill: PrefillTime | None
    pd_prefill: PrefillTime | None
    decode: DecodeTime
    kv: KVSize  # what a transfer moves: the link's wire dtype (Scenario.wire_kv)
    link: LinkSchedule
    flow_cap_gbps: float | None
    intra_gbps: float
    pipelined: bool = True
    kv_layers: int = DEFAULT_KV_LAYERS
    prefill_order: str = "fifo"
    rtt_s: float = 0.0  # added to every transfer across the inter-cluster link
    # requests waiting for their first token at one prefill instance before the next spills to
    # the other route (policy/spill.py; the live topology's admission.max_queued_per_prefill);
    # None: unbounded queues, no spill
    max_queued_per_prefill: int | None = None
    cache_kv: KVSize | None = None  # what a prefix cache holds, when not `kv` (fp8 on the wire)
    # a route's fixed cost beyond prefill compute and KV transfer (HTTP hops, the decoder's
    # notice of its KV and first step, the stream back), added to the first token's time and
    # occupying no instance; measured on an idle deployment (experiments/idle_routes.py)
    local_overhead_s: float = 0.0
    remote_overhead_s: float = 0.0
    # prefill instances (simulator ids: prfaas-p0000, pd-p0000, ...) pinned to the same cores,
    # one tuple per set, and how much longer each of two concurrent prefills there takes than
    # alone (sim/sharing.py; 2.0: pure processor sharing). Empty: independent machines
    core_groups: tuple[tuple[str, ...], ...] = ()
    core_share_factor: float = 2.0
    # the order transfers cross the inter-cluster link in (sim/link.py): "shared" (processor
    # sharing: the native worker interleaves them) or "fifo" (one at a time: the vLLM connector)
    link_order: str = "shared"
    # when a prefill hands its KV to the link (models/kv_release.py: chunks and recurrent
    # state, the vLLM connector's way); None: layer by layer, the last layer's share left at
    # prefill end
    kv_release: KvRelease | None = None

    def describe(self) -> dict[str, Any]:
        """The resolved configuration, written beside results."""
        return {"system": self.system, "router": self.router,
                "threshold_tokens": self.threshold_tokens, "n_prfaas": self.n_prfaas,
                "n_p": self.n_p, "n_d": self.n_d,
                "link_schedule": [list(p) for p in zip(self.link.start_s, self.link.gbps,
                                                       strict=True)],
                "flow_cap_gbps": self.flow_cap_gbps, "intra_gbps": self.intra_gbps,
                **({"rtt_s": self.rtt_s} if self.rtt_s else {}),
                **({"max_queued_per_prefill": self.max_queued_per_prefill}
                   if self.max_queued_per_prefill is not None else {}),
                **({"local_overhead_s": self.local_overhead_s,
                    "remote_overhead_s": self.remote_overhead_s}
                   if self.local_overhead_s or self.remote_overhead_s else {}),
                **({"core_groups": [list(g) for g in self.core_groups],
                    "core_share_factor": self.core_share_factor} if self.core_groups else {}),
                **({"link_order": self.link_order} if self.link_order != "shared" else {}),
                **({"kv_release": self.kv_release.describe()} if self.kv_release else {}),
                "pipelined": self.pipelined, "kv_layers": self.kv_layers,
                "prefill_order": self.prefill_order}


def _schedule(link: dict[str, Any], gbps: float) -> LinkSchedule:
    raw = link.get("schedule")
    if raw is None:
        return LinkSchedule.constant(gbps)
    if not isinstance(raw, list):
        raise ConfigError("link.schedule", raw, "expected a list of [start_s, gbps]")
    points = []
    for i, p in enumerate(raw):
        if isinstance(p, dict):
            points.append((float(p.get("start_s", -1)), float(p.get("gbps", 0))))
        elif isinstance(p, list | tuple) and len(p) == 2:
            points.append((float(p[0]), float(p[1])))
        else:
            raise ConfigError(f"link.schedule[{i}]", p, "expected [start_s, gbps]")
    return LinkSchedule.piecewise(points)


def build_system(s: Scenario, system: str, *, threshold_tokens: int | None = None,
                 n_p: int | None = None, n_d: int | None = None,
                 plan_mode: str = "exact", planned: PlanResult | None = None,
                 **overrides: Any) -> SystemConfig:
    """A system with the planner's optimum (`planned`, or solved here in `plan_mode`), then
    `threshold_tokens`, `n_p`, `n_d` and any SystemConfig field in `overrides` (e.g. link,
    pipelined, prefill_order) replacing it."""
    if system not in SYSTEMS:
        raise UnknownNameError("system", system, list(SYSTEMS))
    if planned is None:
        from prfaas.planner.search import plan_all

        planned = plan_all(s, mode=plan_mode)
    plan = planned.systems[system]
    link_raw = s.raw.get("link", {}) if isinstance(s.raw.get("link"), dict) else {}
    decode_hw = {"prfaas_pd": s.pd, "homogeneous_pd": s.homogeneous,
                 "naive_heterogeneous": s.naive_decode}[system].hardware
    layers = s.model.num_layers if s.model is not None else DEFAULT_KV_LAYERS
    base: dict[str, Any] = dict(
        decode=decode_hw.require_decode(), kv=s.wire_kv, link=_schedule(link_raw, s.link_gbps),
        cache_kv=s.kv if s.wire_kv is not s.kv else None,
        flow_cap_gbps=s.flow_cap_gbps, rtt_s=s.tcp.rtt_s, intra_gbps=s.intra_gbps,
        pipelined=bool(link_raw.get("pipelined", True)), kv_layers=layers,
        link_order=s.link_order, kv_release=s.kv_release)
    pool = s.pd.instances if system == "prfaas_pd" else s.homogeneous.instances
    if n_p is not None and n_d is None:
        n_d = pool - n_p  # one flag moves the split; the pool size stays
    elif n_d is not None and n_p is None and system != "naive_heterogeneous":
        n_p = pool - n_d
    n_p_val = n_p if n_p is not None else plan.n_p
    n_d_val = n_d if n_d is not None else plan.n_d
    if system == "prfaas_pd":
        t = threshold_tokens if threshold_tokens is not None else plan.threshold_tokens
        cfg = SystemConfig(system, "prfaas-threshold", t, s.prfaas.instances, int(n_p_val or 0),
                           int(n_d_val), s.prfaas.hardware.require_prefill(),
                           s.pd.hardware.require_prefill(), **base)
        total = s.pd.instances
    elif system == "homogeneous_pd":
        cfg = SystemConfig(system, "all-pd", None, 0, int(n_p_val or 0), int(n_d_val), None,
                           s.homogeneous.hardware.require_prefill(), **base)
        total = s.homogeneous.instances
    else:
        cfg = SystemConfig(system, "all-prfaas", None, s.naive_prefill.instances, 0,
                           int(n_d if n_d is not None else s.naive_decode.instances),
                           s.naive_prefill.hardware.require_prefill(), None, **base)
        total = cfg.n_d
    cfg = replace(cfg, **overrides) if overrides else cfg
    _validate(cfg, total)
    return cfg


def _validate(cfg: SystemConfig, pd_total: int) -> None:
    if cfg.n_d < 1:
        raise ConfigError("n_d", cfg.n_d, "need at least one decode instance")
    if cfg.system != "naive_heterogeneous":
        if cfg.n_p < 1:
            raise ConfigError("n_p", cfg.n_p, "need at least one local prefill instance")
        if cfg.n_p + cfg.n_d != pd_total:
            raise ConfigError("n_p + n_d", cfg.n_p + cfg.n_d,
                              f"the PD pool of {cfg.system} has {pd_total} instances")
    if cfg.threshold_tokens is not None and cfg.threshold_tokens < 0:
        raise ConfigError("threshold_tokens", cfg.threshold_tokens, "must be >= 0")
    if cfg.prefill_order not in PREFILL_ORDERS:
        raise UnknownNameError("prefill_order", cfg.prefill_order, list(PREFILL_ORDERS))
    if cfg.link_order not in LINK_ORDERS:
        raise UnknownNameError("link.order", cfg.link_order, list(LINK_ORDERS))
    if cfg.max_queued_per_prefill is not None and cfg.max_queued_per_prefill < 1:
        raise ConfigError("max_queued_per_prefill", cfg.max_queued_per_prefill, "must be >= 1")
    check_core_share_factor(cfg.core_share_factor)
    if len({i for g in cfg.core_groups for i in g}) != sum(len(g) for g in cfg.core_groups):
        raise ConfigError("core_groups", cfg.core_groups, "an instance is in two groups")
    if not cfg.intra_gbps > 0:
        raise ConfigError("intra_gbps", cfg.intra_gbps, "must be positive")
