"""The shape controller in the live router: the policy's `ShapeController` (the simulator's
object) fed as requests are routed, ticked every `TICK_S`, its changes carried out with the
deployment that owns the workers (on Ray: serve/deploy/ray/shape.py).

A change goes through states, shown by `GET /shape`, `/health` and the metrics:
- `draining`: the router routes no new work to the instance (it leaves the view like a down
  worker); what it holds finishes there;
- `drained`: nothing of it in flight (the router's own count); the deployment may restart it;
- `switching`: the deployment said it is restarting it (`POST /shape/switch`); its health checks
  pause;
- then `POST /shape/join`: it serves in its new role at its new address (`ok: true`), or after
  a failed restart in its old role again (`ok: false`, with what failed); it is routed to
  again and its prefix cache is forgotten (it restarted). A failed join without a pid (not even
  the old role came back) leaves it down until its health checks pass.
A change no deployment takes up within `ABANDON_S` of being drained is abandoned: the instance
serves in its old role again (`failed`, "no deployment took it up").
`POST /shape/change {instance, role}` asks for a change by hand; the controller refuses (409
with the reason) one that would leave a role with fewer than `min_per_role` instances, undo the
last move within `hold_s`, or come while another runs. Every decision is logged and counted
(`prfaas_shape_decisions_total{outcome}`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from prfaas.core.types import Role, RouteDecision, RouteQuery
from prfaas.policy.shape import Refusal, ShapeChange, ShapeController, apply_threshold
from prfaas.serve.tasks import cancel_and_wait
from prfaas.serve.topology import WorkerSpec

if TYPE_CHECKING:
    from prfaas.serve.router.service import RouterService

log = logging.getLogger("prfaas.serve.router.shape")
TICK_S = 1.0
ABANDON_S = 120.0
WORKER_ROLE: dict[Role, str] = {"prefill": "pd-p", "decode": "pd-d"}
POLICY_ROLE: dict[str, Role] = {"pd-p": "prefill", "pd-d": "decode"}


@dataclass
class LiveChange:
    """A change in progress; times are the router's view clock (s since it started)."""

    change: ShapeChange
    started_s: float
    state: str = "draining"
    drained_s: float | None = None
    switching_s: float | None = None

    def to_json(self, inflight: int) -> dict[str, Any]:
        c = self.change
        return {"instance": c.instance_id, "from": WORKER_ROLE[c.from_role],
                "to": WORKER_ROLE[c.to_role], "state": self.state, "inflight": inflight,
                "started_s": round(self.started_s, 3),
                "drain_s": None if self.drained_s is None
                else round(self.drained_s - self.started_s, 3),
                "threshold_tokens": c.threshold_tokens, "reason": c.reason,
                "requested": c.requested}


class LiveShape:
    def __init__(self, service: RouterService, controller: ShapeController) -> None:
        self.service, self.controller = service, controller
        self.current: LiveChange | None = None
        self.history: list[dict[str, Any]] = []  # every change that ended
        self._task: asyncio.Task[None] | None = None

    # -- what the dispatcher feeds -----------------------------------------------------------
    def observe_route(self, query: RouteQuery, decision: RouteDecision) -> None:
        """A routed request, as the simulator's ShapePlugin feeds it (sim/shape.py)."""
        if decision.rejected:
            return
        info = query.request
        self.controller.observe(info.arrival_s, info.input_tokens, info.output_tokens,
                                max(query.cached_tokens.values(), default=0),
                                decision.prefill_instance, decision.cached_tokens)

    # -- the periodic task ---------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.step()
            except Exception:  # a bug must not end the controller silently
                log.exception("shape controller step failed")

    def step(self) -> None:
        view = self.service.cluster.view()
        if self.current is None:
            got = self.controller.tick(view)
            if isinstance(got, ShapeChange):
                self._begin(got, view.now_s)
            elif isinstance(got, Refusal):
                log.warning("shape: refused (%s) %s: %s", got.kind, got.instance_id, got.reason)
            return
        cur, now = self.current, view.now_s
        if cur.state == "draining" and self._inflight(cur.change.instance_id) == 0:
            cur.state, cur.drained_s = "drained", now
            log.warning("shape: %s drained in %.1f s", cur.change.instance_id,
                        now - cur.started_s)
        elif cur.state == "drained" and now - (cur.drained_s or now) > ABANDON_S:
            self._end(now, ok=False, detail="no deployment took it up", spec=None)

    def _begin(self, change: ShapeChange, now_s: float) -> None:
        self.current = LiveChange(change, now_s)
        cluster = self.service.cluster
        cluster.draining = cluster.draining | {change.instance_id}
        log.warning("shape: %s %s -> %s: %s", change.instance_id, WORKER_ROLE[change.from_role],
                    WORKER_ROLE[change.to_role], change.reason)
        self.step()  # nothing in flight: drained at once

    def _inflight(self, name: str) -> int:
        return self.service.cluster.loads[name].inflight

    def _end(self, now_s: float, ok: bool, detail: str, spec: WorkerSpec | None) -> None:
        cur = self.current
        assert cur is not None
        name = cur.change.instance_id
        self.current = None
        svc = self.service
        if spec is not None:
            svc.replace_worker(spec)
        svc.membership.rejoin(name, svc.membership.states[name].pid, role_changed=ok)
        svc.cluster.draining = svc.cluster.draining - {name}
        self.controller.finished(name, now_s, ok, detail)
        if ok:
            apply_threshold(svc.policy, cur.change.threshold_tokens, now_s)
        entry = {"at_s": round(cur.started_s, 3), "instance": name,
                 "from": WORKER_ROLE[cur.change.from_role], "to": WORKER_ROLE[cur.change.to_role],
                 "reason": cur.change.reason, "requested": cur.change.requested,
                 "drain_s": None if cur.drained_s is None
                 else round(cur.drained_s - cur.started_s, 3),
                 "switch_s": None if cur.switching_s is None else round(now_s - cur.switching_s, 3),
                 "ended_s": round(now_s, 3), "ok": ok, "detail": detail}
        self.history.append(entry)
        role = spec.role if spec is not None else svc.topology.worker(name).role
        log.warning("shape: %s serves as %s (%s)", name, role, detail or "changed")

    # -- HTTP ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        cur = self.current
        return {"now_s": round(self.service.cluster.view().now_s, 4),
                "change": cur.to_json(self._inflight(cur.change.instance_id)) if cur else None,
                "history": self.history[-50:], "controller": self.controller.to_json(),
                "roles": {w.name: w.role for w in self.service.topology.workers}}

    async def get(self, _: web.Request) -> web.Response:
        return web.json_response(self.to_json())

    async def change(self, request: web.Request) -> web.Response:
        """An operator's change: {instance, role: pd-p|pd-d}."""
        body = await _body(request)
        name, role = body.get("instance"), body.get("role")
        if not isinstance(name, str) or role not in POLICY_ROLE:
            return _error(400, f"need {{instance, role: pd-p|pd-d}}; got {body}")
        view = self.service.cluster.view()
        got = self.controller.review(name, POLICY_ROLE[role], view)
        if isinstance(got, Refusal):
            log.warning("shape: refused (%s) %s -> %s: %s", got.kind, name, role, got.reason)
            return web.json_response({"refused": got.to_json()}, status=409)
        self._begin(got, view.now_s)
        return web.json_response({"change": got.to_json()})

    def _current_in(self, body: dict[str, Any], state: str) -> tuple[Any, web.Response | None]:
        """The change of `body`'s instance when it is in `state`, else a 409 saying why."""
        cur = self.current
        if cur is None or body.get("instance") != cur.change.instance_id:
            return None, _error(409, f"no change of {body.get('instance')!r} in progress")
        if cur.state != state:
            return None, _error(409, f"{cur.change.instance_id} is {cur.state}, not {state}")
        return cur, None

    async def switch(self, request: web.Request) -> web.Response:
        """The deployment restarts the drained instance now."""
        body = await _body(request)
        cur, refused = self._current_in(body, "drained")
        if refused is not None:
            return refused
        assert cur is not None
        cur.state, cur.switching_s = "switching", self.service.cluster.view().now_s
        self.service.membership.switching.add(cur.change.instance_id)
        return web.json_response(cur.to_json(0))

    async def join(self, request: web.Request) -> web.Response:
        """{instance, ok, detail, host, port, kv_port, pid}: serving again, in its new role
        (ok) or its old one; where it listens now."""
        body = await _body(request)
        cur, refused = self._current_in(body, "switching")
        if refused is not None:
            return refused
        assert cur is not None
        ok = body.get("ok") is True
        try:
            old = self.service.topology.worker(cur.change.instance_id)
            role = WORKER_ROLE[cur.change.to_role] if ok else old.role
            spec = replace(old, role=role, host=str(body.get("host", old.host)),  # type: ignore[arg-type]
                           port=int(body.get("port", old.port)),
                           kv_port=int(body.get("kv_port", 0)) if role == "pd-d" else 0)
            pid = body.get("pid")
        except (TypeError, ValueError) as exc:
            return _error(400, f"bad join {body}: {exc}")
        now = self.service.cluster.view().now_s
        started = isinstance(pid, int) and pid > 0
        self.service.membership.states[spec.name].pid = pid if started else None
        self._end(now, ok, str(body.get("detail", "")), spec)
        if not ok and not started:  # not even its old role came back: down until it checks up
            self.service.membership.suspect(spec.name, "not running after a failed role change")
        return web.json_response(self.history[-1])


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)

