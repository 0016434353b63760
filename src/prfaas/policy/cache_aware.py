"""`cache-aware`: the paper's cache-aware placement with its two bandwidth regimes
(REFERENCE.md section 2 item 7), l_total = input length, l_pd / l_prfaas = the longest prefix
cached in each cluster's prefill instances.

- Bandwidth scarce: each cluster uses only its own cache. Uncached length l_total - l_pd <= t:
  prefill on PD-P, else on PrfaaS (reusing only what PrfaaS holds). No prefix crosses the link.
- Bandwidth abundant: l_prefix = max(l_prfaas, l_pd); l_total - l_prefix <= t: PD-P, else
  PrfaaS; when the longer cache is in the other cluster, the prefix is moved cross-cluster
  (`RouteDecision.prefix_source`, `prefix_transfer_tokens`: only the part the receiving node
  lacks) - unless moving it is predicted slower than recomputing it (`view.kv_transfer_s` vs
  the prefill time saved), in which case the node recomputes.

The switch is defined on the measured link utilisation u = egress_gbps / capacity_gbps with
hysteresis: the router enters "scarce" when u > `scarce_above` (default 0.7) and returns to
"abundant" only when u < `abundant_below` (default 0.5), so a utilisation hovering at one cut-off
does not flip the regime per request. A link backlog (`pending_bytes`) worth more than
`scarce_backlog_s` seconds at the current capacity also counts as scarce.

Inside the chosen cluster the node is cache-affine and load-aware: the prefill instance with the
smallest queue + own service time given the prefix it will hold (ties: longer cache, name).

Down parts (policy/base.py): while the link is down the PrfaaS cluster is treated as absent
(its caches too: no prefix crosses a down link) and the regime is not updated; a one-sided view
routes everything to the side that is up; no prefill or no decode instance: `no_path`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prfaas.core.errors import ConfigError
from prfaas.core.pool import RankedPool
from prfaas.core.types import (
    PD_CLUSTER,
    PRFAAS_CLUSTER,
    ClusterView,
    InstanceLoad,
    LinkStatus,
    Route,
    RouteDecision,
    RouteQuery,
    link_usable,
)
from prfaas.policy.base import (
    NO_DECODE,
    Router,
    cheapest,
    no_prefill_reason,
    pick_decode,
    register,
)

GBPS_BYTES = 1e9 / 8


@dataclass(frozen=True, slots=True)
class RegimeConfig:
    """When the link counts as scarce (see module docstring)."""

    scarce_above: float = 0.7
    abundant_below: float = 0.5
    scarce_backlog_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.abundant_below <= self.scarce_above:
            raise ConfigError("abundant_below", self.abundant_below,
                              f"must be in (0, scarce_above={self.scarce_above}]")
        if self.scarce_backlog_s <= 0:
            raise ConfigError("scarce_backlog_s", self.scarce_backlog_s, "must be positive")


class RegimeSwitch:
    """The scarce/abundant state machine; `update` reads one LinkStatus."""

    def __init__(self, config: RegimeConfig) -> None:
        self.config = config
        self.scarce = False
        self.switches = 0

    def update(self, link: LinkStatus) -> bool:
        cap = max(link.capacity_gbps, 1e-12)
        util = link.egress_gbps / cap
        backlog_s = link.pending_bytes / (cap * GBPS_BYTES)
        if backlog_s > self.config.scarce_backlog_s:
            util = max(util, self.config.scarce_above + 1.0)  # a backlog means saturated
        new = util > self.config.scarce_above if not self.scarce else (
            util >= self.config.abundant_below)
        if new != self.scarce:
            self.switches += 1
            self.scarce = new
        return self.scarce


def _usable(cached: int, input_tokens: int) -> int:
    """A prefill computes at least one token (the first output token needs it)."""
    return max(min(cached, input_tokens - 1), 0)


def place(query: RouteQuery, view: ClusterView, candidates: Sequence[InstanceLoad],
          floor_tokens: int = 0) -> tuple[InstanceLoad, int]:
    """Cache-affine, load-aware node: min queue + (move) + service, where each node holds
    max(own cache, floor_tokens) (floor = a prefix moved to it across the link, whose missing
    part costs `view.kv_transfer_s`). Returns the node and its usable cached tokens."""
    total = query.request.input_tokens

    def cached_at(inst: InstanceLoad) -> int:
        return _usable(max(query.cached_tokens.get(inst.instance_id, 0), floor_tokens), total)

    def cost(inst: InstanceLoad) -> tuple[float, int, str]:
        c = cached_at(inst)
        missing = c - _usable(query.cached_tokens.get(inst.instance_id, 0), total)
        move_s = view.kv_transfer_s(missing) if missing > 0 else 0.0
        return (inst.queued_work_s + move_s + view.prefill_time_s(inst.instance_id, total, c),
                -c, inst.instance_id)

    # a node holding nothing reuses (after a move of) the floor alone
    plain = _usable(floor_tokens, total)
    best = cheapest(query, candidates, cost, view.kv_transfer_s(plain) if plain > 0 else 0.0,
                    plain)
    return best, cached_at(best)


def _holder(query: RouteQuery, instances: Sequence[InstanceLoad]) -> tuple[str | None, int]:
    """The instance with the longest cached prefix among `instances` (ties: name)."""
    best: tuple[int, str] | None = None
    names = ([n for n in query.cached_tokens if instances.get(n) is not None]
             if isinstance(instances, RankedPool) else [i.instance_id for i in instances])
    for name in names:
        c = query.cached_tokens.get(name, 0)
        if c > 0 and (best is None or (c, best[1]) > (best[0], name)):
            best = (c, name)
    return (best[1], best[0]) if best else (None, 0)


@register("cache-aware")
class CacheAwareRouter(Router):
    name = "cache-aware"

    def __init__(self, threshold_tokens: int, scarce_above: float = 0.7,
                 abundant_below: float = 0.5, scarce_backlog_s: float = 1.0,
                 check_transfer_gain: bool = True, **_: object) -> None:
        if threshold_tokens < 0:
            raise ConfigError("threshold_tokens", threshold_tokens, "must be >= 0")
        self._t = int(threshold_tokens)
        self.regime = RegimeSwitch(RegimeConfig(scarce_above, abundant_below, scarce_backlog_s))
        self.check_transfer_gain = check_transfer_gain

    def threshold_tokens(self) -> int | None:
        return self._t

    def set_threshold_tokens(self, threshold_tokens: int) -> None:
        """Used by the threshold controller."""
        self._t = max(int(threshold_tokens), 0)

    def route(self, query: RouteQuery, view: ClusterView) -> RouteDecision:
        pd = view.instances(PD_CLUSTER, "prefill")
        prf = view.instances(PRFAAS_CLUSTER, "prefill")
        link = view.link()
        link_up = link_usable(link)
        if not link_up:
            prf = []  # unreachable, and so are its caches
        if not pd and not prf:
            return RouteDecision.no_path(no_prefill_reason(view), self._t)
        total = query.request.input_tokens
        pd_src, l_pd = _holder(query, pd)
        prf_src, l_prf = _holder(query, prf)
        if not link_up or self.regime.update(link):
            local_prefix, remote_src, remote_prefix = l_pd, None, 0
        else:
            local_prefix = max(l_pd, l_prf)
            remote_src, remote_prefix = (prf_src, l_prf) if l_prf > l_pd else (pd_src, l_pd)
        route = Route.PRFAAS if total - local_prefix > self._t else Route.PD
        if not (pd if route is Route.PD else prf):  # one-sided deployment: use what exists
            route = Route.PD if pd else Route.PRFAAS
        own, own_cached = (pd, l_pd) if route is Route.PD else (prf, l_prf)
        if remote_prefix <= own_cached:
            remote_src = None  # the longer (or equal) cache is already on this side
        return self._decide(query, view, route, own, remote_src, remote_prefix)

    def _decide(self, query: RouteQuery, view: ClusterView, route: Route,
                candidates: Sequence[InstanceLoad], src: str | None, prefix: int
                ) -> RouteDecision:
        total = query.request.input_tokens
        inst, cached = place(query, view, candidates)
        moved = 0
        if src is not None:
            alt, alt_cached = place(query, view, candidates, floor_tokens=prefix)
            own = _usable(query.cached_tokens.get(alt.instance_id, 0), total)
            moved = alt_cached - own
            if moved > 0 and self._worth_moving(view, alt, total, own, alt_cached, moved):
                inst, cached = alt, alt_cached
            else:
                src, moved = None, 0
        decoder = pick_decode(view)
        if decoder is None:
            return RouteDecision.no_path(NO_DECODE, self._t)
        return RouteDecision(
            route=route, prefill_instance=inst.instance_id,
            decode_instance=decoder.instance_id,
            cached_tokens=cached, uncached_tokens=total - cached,
            prefix_source=src, prefix_transfer_tokens=moved, threshold_tokens=self._t,
            reason="scarce" if self.regime.scarce else "abundant")

    def _worth_moving(self, view: ClusterView, inst: InstanceLoad, total: int, own: int,
                      after: int, moved: int) -> bool:
        if not self.check_transfer_gain:
            return True
        saved_s = (view.prefill_time_s(inst.instance_id, total, own)
                   - view.prefill_time_s(inst.instance_id, total, after))
        return view.kv_transfer_s(moved) < saved_s
