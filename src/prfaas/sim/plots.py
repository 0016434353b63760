"""PNG plots of simulation results (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path

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
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.set_xscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def throughput_vs_offered(results: dict[str, CapacityResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    top = 0.0
    for name, res in results.items():
        probes = sorted(res.probes, key=lambda p: p.rate_rps)
        x = [p.rate_rps for p in probes]
        ax.plot(x, [p.throughput_rps for p in probes], marker="o", label=name)
        top = max(top, *x)
    ax.plot([0, top], [0, top], color="grey", linestyle=":", label="throughput = offered")
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("throughput (req/s)")
    ax.set_title("Throughput vs offered load (capacity-search probes, uniform arrivals)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def egress_over_time(egress_gbps: FloatArray, capacity_gbps: float, title: str, path: Path
                     ) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(np.arange(egress_gbps.size), egress_gbps, linewidth=0.8, label="egress (1 s windows)")
    ax.axhline(capacity_gbps, color="red", linestyle="--", label="link capacity")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("Gbps")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
