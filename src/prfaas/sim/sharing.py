"""Prefill instances that share compute (processor sharing between instances on the same cores).

A topology may pin several instances to the same CPU cores (`cores:` of each worker, the field
the launcher pins with); their prefills then run on one core at once. A `CoreGroup` holds the
simulated prefill instances of one such set. While k of them run a prefill, each progresses at
1 / slowdown(k) of its standalone rate (its profile's T(l) is what it takes alone):
slowdown(1) = 1, slowdown(2) = `factor` (measured: the profile's `core_sharing`, two concurrent
prefills on two instances pinned to one core vs one alone; 2.0, pure processor sharing of one
core, when nothing was measured), and beyond two, each further prefill adds `factor - 1`
(linear in k; with 2.0 exactly k, the processor-sharing law).

Each running member keeps the standalone seconds of work it has left; on every start or finish
in the group the work done since the last change is taken off at the old rate and every running
member's finish time is recomputed at the new one (`retimed`). The simulator then re-schedules
those members' prefill-done events (a member's `version` voids the old event) and the ranked
pools see the new drain times. An instance in no group never reaches this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prfaas.models.profile_file import check_core_share_factor

if TYPE_CHECKING:
    from prfaas.sim.instances import PrefillInstance

PHYSICAL_FACTOR = 2.0  # two prefills on one core, each at half speed: the default


def slowdown(k: int, factor: float) -> float:
    """How much longer each of k concurrent prefills takes than alone."""
    return 1.0 + (factor - 1.0) * (k - 1) if k > 1 else 1.0


class CoreGroup:
    def __init__(self, factor: float = PHYSICAL_FACTOR) -> None:
        self.factor = check_core_share_factor(factor)
        self._left: dict[PrefillInstance, float] = {}  # running member -> standalone s left
        self._last_s = 0.0

    @property
    def running(self) -> int:
        return len(self._left)

    def start(self, inst: PrefillInstance, service_s: float, now_s: float
              ) -> list[PrefillInstance]:
        """`inst` starts a prefill of `service_s` standalone seconds; the running members
        (`inst` included) with their new `busy_until_s`."""
        self._advance(now_s)
        self._left[inst] = service_s
        return self._retime(now_s)

    def finish(self, inst: PrefillInstance, now_s: float) -> list[PrefillInstance]:
        """`inst`'s prefill is over (or it went down); the members still running, retimed."""
        self._advance(now_s)
        self._left.pop(inst, None)
        return self._retime(now_s)

    def _advance(self, now_s: float) -> None:
        left = self._left
        if left and now_s > self._last_s:
            done = (now_s - self._last_s) / slowdown(len(left), self.factor)
            for inst, s in left.items():
                left[inst] = s - done if s > done else 0.0
        self._last_s = now_s

    def _retime(self, now_s: float) -> list[PrefillInstance]:
        rate = slowdown(len(self._left), self.factor)
        out = list(self._left)
        for inst in out:
            inst.retime(now_s + self._left[inst] * rate)
        return out
