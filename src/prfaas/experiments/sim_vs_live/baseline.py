"""The no-simulator baseline: a request's TTFT predicted from the idle points alone.

Per route, the median idle TTFT at each measured prompt length, joined by straight lines and
continued along the end segments beyond the measured lengths (never below the shortest
measured TTFT's tenth: a line cannot promise a free first token). It knows each route's
prefill, transfer and fixed costs on the idle deployment, measured minutes before the loads,
and nothing of queueing: what a user could predict with a stopwatch and no simulator. A
simulator that does not beat it at a load has not shown that it models that load.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def idle_curves(points: list[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """route -> (lengths, median idle TTFT at each), lengths ascending."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for route in sorted({str(p["route"]) for p in points}):
        by_len: dict[int, list[float]] = {}
        for p in points:
            if p["route"] == route:
                by_len.setdefault(int(p["length_tokens"]), []).append(float(p["ttft_s"]))
        xs = np.array(sorted(by_len), dtype=float)
        out[route] = (xs, np.array([np.median(by_len[int(x)]) for x in xs]))
    return out


def interpolate(xs: np.ndarray, ys: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Piecewise-linear through (xs, ys), extended along the first and last segments."""
    at = np.asarray(at, dtype=float)
    if xs.size == 1:
        return np.full(at.shape, float(ys[0]))
    out = np.interp(at, xs, ys)
    lo, hi = at < xs[0], at > xs[-1]
    out[lo] = ys[0] + (at[lo] - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
    out[hi] = ys[-1] + (at[hi] - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.maximum(out, 0.1 * float(ys.min()))


def predict(points: list[dict[str, Any]], lengths: np.ndarray, remote: np.ndarray
            ) -> np.ndarray:
    """The baseline's TTFT for each request (its length, its route); nan where its route has
    no idle point."""
    curves = idle_curves(points)
    out = np.full(np.asarray(lengths).shape, np.nan)
    for route, keep in (("prfaas", remote), ("pd", ~remote)):
        if route in curves and keep.any():
            xs, ys = curves[route]
            out[keep] = interpolate(xs, ys, np.asarray(lengths, dtype=float)[keep])
    return out
