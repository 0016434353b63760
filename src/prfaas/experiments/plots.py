"""The live reproduction's plot: throughput against offered load, live (markers) and
simulated on the same workloads (lines), every probe and TTFT run of every system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prfaas.sim.plots import finish_axes


def live_vs_sim(result: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = 0.0
    for name, sysres in result["systems"].items():
        runs = sorted(sysres["runs"], key=lambda r: r["live"]["offered_rps"])
        x = [r["live"]["offered_rps"] for r in runs]
        sim_line, = ax.plot([r["sim"]["offered_rps"] for r in runs],
                            [r["sim"]["throughput_rps"] for r in runs], lw=1.2,
                            label=f"{name} simulated")
        ax.scatter(x, [r["live"]["throughput_rps"] for r in runs], color=sim_line.get_color(),
                   marker="o", s=28, label=f"{name} live (emulated)")
        ax.axhline(sysres["live_capacity_rps"], color=sim_line.get_color(), ls="--", lw=0.7)
        top = max(top, *x)
    ax.plot([0, top], [0, top], color="grey", ls=":", label="throughput = offered")
    return finish_axes(fig, ax, "offered load (scenario req/s)",
                       "ready throughput: KV at the decoder (scenario req/s)",
                       f"{result['scenario']}: live emulated vs simulator (dashed: live capacity)",
                       path, legend_fontsize=7)
