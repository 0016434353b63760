"""sim-vs-live's plot: per-request TTFT, simulated against live, one colour per load (the
diagonal is a perfect prediction); the legend carries each load's share of capacity, the
simulator's MAPE with its interval and the no-simulator baseline's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prfaas.sim.plots import finish_axes


def _label(load: dict[str, Any]) -> str:
    mape, ci, base = load["ttft_mape"], load.get("ttft_mape_ci90"), load.get("baseline_ttft_mape")
    head = f"{load.get('share_of_capacity', 0):.2f} of capacity ({load['offered_rps']:.3f} req/s)"
    if mape is None:
        return head
    return (head + f": MAPE {mape:.0%}" + (f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else "")
            + (f", baseline {base:.0%}" if base is not None else ""))


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
        ax.scatter(xs, ys, s=14, label=_label(load))
        top = max(top, *xs, *ys)
    ax.plot([0, top], [0, top], color="grey", ls=":", label="sim = live")
    host = result.get("host") or {}
    where = f", {host.get('cpus')}-core {host.get('isa')} host" if host else ""
    return finish_axes(fig, ax, "live TTFT (s, client)", "simulated TTFT (s)",
                       f"{result['topology']} ({result['engine']}{where}): simulator vs live",
                       path, legend_fontsize=7)
