"""Per-request accuracy of the simulator against a live run of the same requests (BLIS-style
calibration): for each metric, the relative error |sim - live| / live of every request both
worlds completed, summarised as MAPE (its mean) and its P50 / P90, beside the two worlds' own
P50 / P90 of the metric."""

from __future__ import annotations

from typing import Any

import numpy as np


def per_request_error(live: np.ndarray, sim: np.ndarray, unit: float = 1.0) -> dict[str, Any]:
    """`live` and `sim`: the metric per request (same order; nan = not completed); `unit`
    divides the reported P50/P90 values (e.g. a time scale), not the relative errors."""
    live, sim = np.asarray(live, dtype=float), np.asarray(sim, dtype=float)
    ok = np.isfinite(live) & np.isfinite(sim) & (live > 0)
    if not ok.any():
        return {"n": 0}
    err = np.abs(sim[ok] - live[ok]) / live[ok]
    return {"mape": round(float(err.mean()), 4),
            "p50_err": round(float(np.percentile(err, 50)), 4),
            "p90_err": round(float(np.percentile(err, 90)), 4),
            "bias": round(float(np.mean((sim[ok] - live[ok]) / live[ok])), 4),
            "live_p50_s": round(float(np.percentile(live[ok], 50)) / unit, 4),
            "sim_p50_s": round(float(np.percentile(sim[ok], 50)) / unit, 4),
            "live_p90_s": round(float(np.percentile(live[ok], 90)) / unit, 4),
            "sim_p90_s": round(float(np.percentile(sim[ok], 90)) / unit, 4),
            "n": int(ok.sum())}
