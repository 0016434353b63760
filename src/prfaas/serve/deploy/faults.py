"""Faults of the kernel-shaped inter-DC link (link.emulation: netns), under load.

Used by tests/serve/test_serve_link_faults.py (short windows) and benchmarks/bench_faults.py
(the issue's windows). A `Fault` names what happens to the NetnsLink and for how long:
- `partition`: the veth is down for `duration_s` (nothing crosses, both directions);
- `rate-drop`: the tbf rate is divided by `factor` for `duration_s`, then restored;
- `flap`: down `period_s`, up `period_s`, ... for `duration_s`;
- `rtt`: `delay_ms` added to every chunk crossing the link's user-space delay stage
  (serve/deploy/delay.py; netem is not available here), for `duration_s`.
`FaultRunner` applies one in a thread at `start_s` after `t0` and records the window; it
always restores the link. `summarize` turns load results (prfaas.bench.loadgen.Result) into
the per-fault figures: sent, completed, shed (429/503: refused, never accepted), lost
(accepted and not completed), TTFT P50/P99 (all / during the window), and the
share of requests sent during the window that were prefilled locally.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prfaas.core.errors import ConfigError
from prfaas.serve.deploy.netns import NetnsLink

KINDS = ("partition", "rate-drop", "flap", "rtt")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    start_s: float  # after the load starts
    duration_s: float
    factor: float = 10.0  # rate-drop: rate / factor
    period_s: float = 2.0  # flap: each down and each up phase
    delay_ms: float = 30.0  # rtt: added per chunk crossing the link (see delay.py)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("fault.kind", self.kind, f"unknown; known: {', '.join(KINDS)}")
        if not (self.duration_s > 0 and self.start_s >= 0 and self.factor > 1
                and self.period_s > 0 and self.delay_ms >= 0):
            raise ConfigError("fault", self, "durations and factor out of range")


@dataclass
class FaultRunner:
    """Applies `fault` to `link` in a thread, `fault.start_s` after `t0` (time.monotonic)."""

    link: NetnsLink
    fault: Fault
    t0: float
    set_delay_ms: Callable[[float], None] | None = None  # rtt: the delay stage's control
    window: tuple[float, float] = (0.0, 0.0)  # relative to t0, as it happened
    events: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> FaultRunner:
        self._thread = threading.Thread(target=self._run, name="prfaas-fault", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float = 120.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _sleep_until(self, at_s: float) -> None:
        time.sleep(max(self.t0 + at_s - time.monotonic(), 0.0))

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _run(self) -> None:
        f = self.fault
        self._sleep_until(f.start_s)
        start = self._now()
        try:
            if f.kind == "partition":
                self.link.set_up(False)
                self._sleep_until(f.start_s + f.duration_s)
            elif f.kind == "rate-drop":
                self.link.set_rate(self.link.rate_gbps / f.factor)
                self._sleep_until(f.start_s + f.duration_s)
            elif f.kind == "flap":
                self._flap()
            else:
                assert self.set_delay_ms is not None, "rtt needs the delay stage's control"
                self.set_delay_ms(f.delay_ms)
                self._sleep_until(f.start_s + f.duration_s)
        finally:
            self._restore()
            self.window = (start, self._now())
            self.events.append(f"{f.kind}: {self.window[0]:.1f}-{self.window[1]:.1f} s")

    def _flap(self) -> None:
        f, at = self.fault, self.fault.start_s
        while at < f.start_s + f.duration_s:
            self.link.set_up(False)
            self._sleep_until(at := at + f.period_s)
            self.link.set_up(True)
            self._sleep_until(at := at + f.period_s)

    def _restore(self) -> None:
        self.link.set_up(True)
        if self.fault.kind == "rate-drop":
            self.link.set_rate(self.link.rate_gbps)
        if self.fault.kind == "rtt" and self.set_delay_ms is not None:
            self.set_delay_ms(0.0)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(results: Sequence[Any], window: tuple[float, float]) -> dict[str, Any]:
    """Per-fault figures from loadgen Results (`sent_s` relative to the same t0)."""
    ok = [r for r in results if r.ok]
    during = [r for r in results if window[0] <= r.sent_s < window[1]]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    ttft_during = [r.ttft_s for r in during if r.ok and r.ttft_s is not None]
    local = [r for r in during if r.ok and r.prfaas.get("route") == "pd"]
    shed = [r for r in results if r.status in (429, 503)]  # refused, never accepted
    return {
        "sent": len(results), "completed": len(ok), "shed": len(shed),
        "lost": len(results) - len(ok) - len(shed),  # accepted and not completed
        "errors": sorted({r.error[:120] for r in results if not r.ok})[:5],
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "during": {"sent": len(during), "ttft_p50_s": _pct(ttft_during, 50),
                   "ttft_p99_s": _pct(ttft_during, 99),
                   "share_local": len(local) / len(during) if during else None},
        "retried": sum(1 for r in ok if r.prfaas.get("retried")),
        "resumed": sum(1 for r in ok if r.prfaas.get("resumed")),
        "window_s": list(window),
    }
