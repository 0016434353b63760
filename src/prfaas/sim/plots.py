"""PNG plots of simulation results (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from prfaas.sim.capacity import CapacityResult

FloatArray = np.ndarray


def ttft_cdf(ttfts: dict[str, FloatArray], title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in ttfts.items():
        v = np.sort(values[np.isfinite(values)])
        ax.plot(v, np.arange(1, v.size + 1) / max(v.size, 1), label=name)
    ax.set_xscale("log")
    return finish_axes(fig, ax, "TTFT (s)", "CDF", title, path)


def load_sweep(sweep: dict[str, list[dict[str, float]]], capacity: dict[str, CapacityResult],
               path: Path) -> Path:
    """Two panels over one grid of offered loads: throughput (saturating at each system's
    capacity) and P90 TTFT (the knee where queues start to build)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    top = 0.0
    for name, rows in sweep.items():
        x = [r["offered_rps"] for r in rows]
        line, = left.plot(x, [r["throughput_rps"] for r in rows], marker="o", label=name)
        right.plot(x, [r["ttft_p90_s"] for r in rows], marker="o", label=name)
        left.axhline(capacity[name].max_rps, color=line.get_color(), linestyle="--", lw=0.8)
        top = max(top, *x)
    left.plot([0, top], [0, top], color="grey", linestyle=":", label="throughput = offered")
    left.set_xlabel("offered load (req/s)")
    left.set_ylabel("throughput (req/s)")
    left.set_title("Throughput vs offered load (dashed: capacity)")
    right.set_xlabel("offered load (req/s)")
    right.set_ylabel("P90 TTFT (s)")
    right.set_yscale("log")
    right.set_title("P90 TTFT vs offered load (uniform arrivals)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def egress_over_time(egress_gbps: FloatArray, capacity_gbps: float, title: str, path: Path
                     ) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(np.arange(egress_gbps.size), egress_gbps, linewidth=0.8, label="egress (1 s windows)")
    ax.axhline(capacity_gbps, color="red", linestyle="--", label="link capacity")
    ax.set_yscale("symlog", linthresh=1.0)
    return finish_axes(fig, ax, "time (s)", "Gbps", title, path)


def finish_axes(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path,
                legend_fontsize: float | None = None) -> Path:
    """Labels, grid, legend; save as PNG and release the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
