"""sim-vs-live's plot: per-request TTFT, simulated against live, one colour per load (the
diagonal is a perfect prediction); the legend carries each load's MAPE, throughputs and route
agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prfaas.sim.plots import finish_axes


def ttft_scatter(result: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 5))
    top = 0.0
    for load in result["loads"]:
        pr = load["per_request"]
        pts = [(a, b) for a, b in zip(pr["ttft_live_s"], pr["ttft_sim_s"], strict=True)
               if a is not None and b is not None]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        mape = load["ttft_mape"]
        ax.scatter(xs, ys, s=14, label=(
            f"{load['offered_rps']:.3f} req/s: MAPE {mape:.0%}, thr live/sim "
            f"{load['throughput_live_rps']:.3f}/{load['throughput_sim_rps']:.3f}, "
            f"routes {load['route_agreement']:.0%}" if mape is not None else
            f"{load['offered_rps']:.3f} req/s"))
        top = max(top, *xs, *ys)
    ax.plot([0, top], [0, top], color="grey", ls=":", label="sim = live")
    return finish_axes(fig, ax, "live TTFT (s, client)", "simulated TTFT (s)",
                       f"{result['topology']} ({result['engine']}): simulator vs live",
                       path, legend_fontsize=7)
