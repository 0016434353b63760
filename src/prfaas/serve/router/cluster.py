"""The live router's `ClusterView`: what the policy reads, kept by the router itself.

Loads are the router's own bookkeeping of what it sent where (prefills not yet done and their
predicted work, running decodes), which is exact for a single router and needs no polling.
A prefill worker's queued work is what the simulator's router reads too: the predicted
seconds until it has drained, `busy_until - now`, where each dispatch adds its predicted work
after the current backlog (workers prefill FIFO) and each finished prefill resets it to now
plus the work still queued behind it. A prefill's work is predicted from the worker's cost
model when one is known (`prefill_models`: an emulated worker's hardware profile, T(l) =
c2 l^2 + c1 l + c0, times an EWMA of measured / predicted), else from the seconds per
computed token of the worker's last report (a prior until then), which misjudges long prompts
under quadratic attention cost. KV transfer time comes from the model's KV geometry and the
topology's link rate, times the fraction of its bytes that crossed the wire on that link so far
(an EWMA of the prefill workers' reports; until one reports, `wire_prior`: 1 / the codec's
ratio measured on the engine's KV, router/plan.live_codec, and always 1 without
`link.compression`). The link status is what the threshold controller and the
cache-aware regime switch read: capacity = the topology's `link.rate_gbps` (the token bucket's
rate) or what link telemetry last reported (`POST /link {capacity_gbps}` on the router),
egress = the router's LinkMonitor over the last `LINK_WINDOW_S`, fed with the bytes each PrfaaS
prefill reports having put on the wire (compressed, where it compresses), and pending = the
predicted KV bytes of PrfaaS requests dispatched but not yet delivered. The PrfaaS queue is each
worker's in-flight requests and their predicted prefill seconds. Workers the membership layer
holds down, and workers drained for a role change (`draining`), are left out of `instances`, so
a policy never picks one. The clock is read here, never
in the policy: `now_s` is a snapshot taken when the view is built, and every worker's queued work
is read at that instant. `instances(cluster, role)` is a `RankedPool` (serve/router/live_pool.py)
that this bookkeeping keeps ranked as requests start and finish, workers measure themselves and go
down or up, so the policy's decision reads a few workers, not all, and decides as a scan of them
would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prfaas.core.types import InstanceLoad, LinkStatus, Role
from prfaas.models.kv import KVGeometry
from prfaas.models.profile import PrefillTime
from prfaas.serve.router.live_pool import LivePool, LivePoolView
from prfaas.serve.topology import Topology, WorkerSpec
from prfaas.transport import LinkMonitor

PRIOR_SECONDS_PER_TOKEN = 2e-4  # until a worker has measured itself
UNSHAPED_GBPS = 100.0  # what "no rate limit" on loopback is taken to mean for predictions
LINK_WINDOW_S = 5.0  # egress averaging window: one controller period, smooths per-request bursts
EWMA = 0.2  # weight of the newest measured / predicted ratio


@dataclass(slots=True)
class _Load:
    spec: WorkerSpec
    inflight: int = 0
    inflight_work_s: float = 0.0  # predicted work of the prefills not yet done
    busy_until: float = 0.0  # (monotonic) when the queued prefills are predicted to be done
    seconds_per_token: float = PRIOR_SECONDS_PER_TOKEN
    model: PrefillTime | None = None  # a known cost model (EngineBackend.prefill_models)
    ratio: float = 1.0  # EWMA of measured / model seconds


class LiveCluster:
    """Mutable bookkeeping; `view()` gives the frozen-in-time ClusterView a policy reads."""

    def __init__(self, topology: Topology, geometry: KVGeometry,
                 models: dict[str, PrefillTime] | None = None,
                 clock: Callable[[], float] = time.monotonic, wire_prior: float = 1.0) -> None:
        self.topology = topology
        self.wire_prior = wire_prior  # inter-DC wire / KV bytes until its workers report
        self.geometry = geometry
        self.loads = {w.name: _Load(w, model=(models or {}).get(w.name))
                      for w in topology.workers}
        self.monitor = LinkMonitor(window_s=LINK_WINDOW_S)
        self._wire_fraction: dict[str, float] = {}  # cluster -> EWMA of wire / KV bytes
        order = {w.name: k for k, w in enumerate(topology.workers)}
        self._order = order
        self._pools: dict[tuple[str, Role], LivePool] = {
            (w.cluster, _role(w)): LivePool(_role(w), order) for w in topology.workers}
        for load in self.loads.values():
            self._pool_of(load).add(load)
        self._down: frozenset[str] = frozenset()
        self._draining: frozenset[str] = frozenset()  # a role change: no new work
        self.capacity_gbps: float | None = None  # told by POST /link (link telemetry)
        self._clock = clock
        self._t0 = clock()

    @property
    def down(self) -> frozenset[str]:
        """Workers held down (kept by serve/router/membership.py); not in the view."""
        return self._down

    @down.setter
    def down(self, names: frozenset[str]) -> None:
        self._hide(frozenset(names), self._draining)

    @property
    def draining(self) -> frozenset[str]:
        """Workers being drained for a role change (serve/router/shape.py); not in the view."""
        return self._draining

    @draining.setter
    def draining(self, names: frozenset[str]) -> None:
        self._hide(self._down, frozenset(names))

    def _hide(self, down: frozenset[str], draining: frozenset[str]) -> None:
        before, after = self._down | self._draining, down | draining
        for name in before - after:
            if name in self.loads:
                self._pool_of(self.loads[name]).add(self.loads[name])
        for name in after - before:
            if name in self.loads:
                self._pool_of(self.loads[name]).remove(name)
        self._down, self._draining = down, draining

    def replace_worker(self, spec: WorkerSpec, model: PrefillTime | None) -> None:
        """`spec.name` serves as `spec` from now (a role change): its bookkeeping moves to
        the pool of its new role, with `model` as its cost model (an equal one already held
        is shared, so the pool groups them as before) and a fresh measured ratio."""
        load = self.loads[spec.name]
        hidden = spec.name in self._down | self._draining
        if not hidden:
            self._pool_of(load).remove(spec.name)
        same = next((other.model for other in self.loads.values()
                     if other.model is not None and other.model == model), None)
        load.spec, load.model = spec, same or model
        load.ratio, load.seconds_per_token = 1.0, PRIOR_SECONDS_PER_TOKEN
        key = (spec.cluster, _role(spec))
        if key not in self._pools:
            self._pools[key] = LivePool(_role(spec), self._order)
        if not hidden:
            self._pool_of(load).add(load)

    def _pool_of(self, load: _Load) -> LivePool:
        return self._pools[(load.spec.cluster, _role(load.spec))]

    def pool(self, cluster: str, role: Role) -> LivePool | None:
        return self._pools.get((cluster, role))

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        load = self.loads.get(instance_id)
        if load is not None and load.model is not None:
            return load.model.seconds(total_tokens, cached_tokens) * load.ratio
        per_token = load.seconds_per_token if load else PRIOR_SECONDS_PER_TOKEN
        return max(total_tokens - cached_tokens, 1) * per_token

    def start(self, name: str, work_s: float = 0.0) -> None:
        load = self.loads[name]
        load.inflight += 1
        load.inflight_work_s += work_s
        load.busy_until = max(load.busy_until, self._clock()) + work_s
        self._pool_of(load).touch(load)

    def finish(self, name: str, work_s: float = 0.0) -> None:
        """One request is done with `name` (a prefill worker: its prefill is; the next one
        queued there starts now)."""
        load = self.loads[name]
        load.inflight = max(load.inflight - 1, 0)
        load.inflight_work_s = max(load.inflight_work_s - work_s, 0.0)
        load.busy_until = self._clock() + load.inflight_work_s
        self._pool_of(load).touch(load)

    def queued_work_s(self, name: str, now: float | None = None) -> float:
        """Predicted seconds until `name` has drained, at `now` (monotonic; default: now)."""
        load = self.loads[name]
        at = self._clock() if now is None else now
        return max(load.busy_until - at, 0.0) if load.inflight else 0.0

    def measured(self, name: str, prefill_s: float, total_tokens: int, cached_tokens: int
                 ) -> None:
        """A prefill of `total_tokens` (`cached_tokens` reused) took `prefill_s` there."""
        load = self.loads[name]
        computed = total_tokens - cached_tokens
        if prefill_s <= 0 or computed <= 0:
            return
        if load.model is not None:
            ratio = prefill_s / max(load.model.seconds(total_tokens, cached_tokens), 1e-9)
            load.ratio = (1 - EWMA) * load.ratio + EWMA * ratio
        else:
            load.seconds_per_token = prefill_s / computed
        self._pool_of(load).touch(load)

    def shipped(self, worker: WorkerSpec, kv_bytes: int, wire_bytes: int | None = None
                ) -> None:
        """A prefill shipped `kv_bytes` of KV as `wire_bytes` on its link (None: as is)."""
        wire = kv_bytes if wire_bytes is None else wire_bytes
        if kv_bytes > 0 and wire_bytes is not None:
            old = self._wire_fraction.get(worker.cluster, self._prior(worker))
            self._wire_fraction[worker.cluster] = (1 - EWMA) * old + EWMA * wire / kv_bytes
        if worker.role == "prfaas":
            self.monitor.record_sent(wire)

    def wire_fraction(self, worker: WorkerSpec) -> float:
        """Wire bytes per KV byte on `worker`'s link, as measured (the prior until it
        reports)."""
        return self._wire_fraction.get(worker.cluster, self._prior(worker))

    def _prior(self, worker: WorkerSpec) -> float:
        """`wire_prior` is the inter-DC link's; the intra link learns from 1."""
        return self.wire_prior if worker.role == "prfaas" else 1.0

    def kv_expected_bytes(self, worker: WorkerSpec, shipped_tokens: int) -> int:
        """Predicted KV bytes a PrfaaS prefill will put on the link (0 for local prefill)."""
        if worker.role != "prfaas":
            return 0
        return int(self.geometry.size_bytes(max(shipped_tokens, 1)) * self.wire_fraction(worker))

    def link_capacity_gbps(self) -> float:
        """The inter-DC capacity: what link telemetry last reported (POST /link on the
        router), else the topology's rate."""
        return self.capacity_gbps or self.topology.link.rate_gbps or UNSHAPED_GBPS

    def link_egress_gbps(self) -> float:
        return self.monitor.egress_bytes_per_s() * 8 / 1e9

    def view(self) -> LiveView:
        now = self._clock()
        return LiveView(self, now - self._t0, now)


def _role(w: WorkerSpec) -> Role:
    return "prefill" if w.is_prefill else "decode"


class LiveView:
    """A `ClusterView` over the router's bookkeeping at one instant."""

    def __init__(self, cluster: LiveCluster, now_s: float, now: float | None = None) -> None:
        self._c = cluster
        self._now_s = now_s
        self._now = now  # the monotonic clock at now_s (None: read it per worker)

    @property
    def now_s(self) -> float:
        return self._now_s

    def instances(self, cluster: str | None = None, role: Role | None = None
                  ) -> Sequence[InstanceLoad]:
        if cluster is not None and role is not None and self._now is not None:
            pool = self._c.pool(cluster, role)
            return LivePoolView(pool, self._now) if pool is not None else []
        out = []
        hidden = self._c.down | self._c.draining
        for load in self._c.loads.values():
            w = load.spec
            if w.name in hidden:
                continue
            w_role: Role = "prefill" if w.is_prefill else "decode"
            if (cluster is not None and w.cluster != cluster) or (role and w_role != role):
                continue
            free = max(w.max_batch - load.inflight, 0) if w_role == "decode" else 0
            out.append(InstanceLoad(w.name, w.cluster, w_role, queued_requests=load.inflight,
                                    queued_work_s=self._c.queued_work_s(w.name, self._now),
                                    running=load.inflight, free_slots=free))
        return out

    def link(self) -> LinkStatus:
        rate = self._c.link_capacity_gbps()
        return LinkStatus(capacity_gbps=rate, egress_gbps=self._c.link_egress_gbps(),
                          pending_bytes=float(self._c.monitor.pending_bytes))

    def prefill_time_s(self, instance_id: str, total_tokens: int, cached_tokens: int) -> float:
        return self._c.prefill_time_s(instance_id, total_tokens, cached_tokens)

    def kv_transfer_s(self, tokens: int) -> float:
        rate = self._c.link_capacity_gbps()
        return self._c.geometry.size_bytes(tokens) * 8 / (rate * 1e9)
