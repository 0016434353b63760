"""The two panels of the paper's Figure 5 as PNG: stage bounds against N_p (each N_p at its best
threshold) and the PrfaaS and PD-P bounds against t (at the optimal N_p)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from prfaas.planner.search import PlanInputs, SystemPlan, threshold_grid
from prfaas.planner.throughput import StageCurves, bounds, decode_rate, stage_curves

GBPS = 1e9 / 8


def figure5(inputs: PlanInputs, plan: SystemPlan, mode: str, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    curves = stage_curves(inputs.lengths, threshold_grid(inputs.lengths, inputs.t_step_tokens),
                          inputs.prfaas_prefill, inputs.pd_prefill, inputs.kv, mode)
    n_ps = list(range(1, inputs.n_pd))
    rows = [_best_for_np(inputs, curves, n_p) for n_p in n_ps]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(n_ps, [r[0] for r in rows], "o-", label="Θprfaas / p")
    ax.plot(n_ps, [r[1] for r in rows], "s-", label="Θpd-p / (1 − p)")
    ax.plot(n_ps, [r[2] for r in rows], "^-", label="Θpd-d")
    ax.plot(n_ps, [min(r) for r in rows], "k--", label="Λmax")
    first = _save(fig, ax, "N_p (PD-P instances; N_d = N_pd − N_p)",
                  f"Throughput bounds vs N_p (best t each; {mode} mode)",
                  out_dir / "figure5a_bounds_vs_np.png")
    plt.close(fig)

    assert plan.n_p is not None
    _, _, prf, pdp = bounds(curves, inputs.n_prfaas, plan.n_p, inputs.link_gbps * GBPS)
    fig, ax = plt.subplots(figsize=(6, 4))
    ts_k = curves.thresholds / 1000
    ax.plot(ts_k, np.minimum(prf, 20), label="Θprfaas / p")
    ax.plot(ts_k, np.minimum(pdp, 20), label="Θpd-p / (1 − p)")
    if plan.threshold_tokens is not None:
        ax.axvline(plan.threshold_tokens / 1000, color="k", ls="--",
                   label=f"t* = {plan.threshold_tokens / 1000:.1f}K")
    ax.set_xscale("log")
    ax.set_ylim(0, max(6.0, plan.lambda_max * 2))
    second = _save(fig, ax, "threshold t (K tokens)",
                   f"PrfaaS and PD-P bounds vs t (N_p = {plan.n_p})",
                   out_dir / "figure5b_bounds_vs_t.png")
    plt.close(fig)
    return [first, second]


def _save(fig: Any, ax: Any, xlabel: str, title: str, path: Path) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("requests / s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _best_for_np(inputs: PlanInputs, curves: StageCurves, n_p: int
                 ) -> tuple[float, float, float]:
    """(Θprfaas/p, Θpd-p/(1-p), Θpd-d) at the t that maximises Λ for this N_p."""
    _, _, prf, pdp = bounds(curves, inputs.n_prfaas, n_p, inputs.link_gbps * GBPS)
    i = int(np.argmax(np.minimum(prf, pdp)))
    theta_d = float(decode_rate(inputs.n_pd - n_p, inputs.decode.bs_max,
                                inputs.decode.step_at(inputs.decode.bs_max), inputs.output_tokens))
    return float(prf[i]), float(pdp[i]), theta_d
