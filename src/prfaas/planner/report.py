"""Rendering of plans: a rich table like the paper's Table 6 with the paper's figures beside."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prfaas.planner.search import SYSTEMS, PlanResult

if TYPE_CHECKING:
    from rich.table import Table

TITLES = {"prfaas_pd": "PrfaaS-PD", "homogeneous_pd": "Homogeneous PD",
          "naive_heterogeneous": "Naive heterogeneous PD"}


def _num(value: Any, fmt: str) -> str:
    if value is None:
        return "—"
    return format(value, fmt)


def _pair(ours: Any, paper: Any, fmt: str) -> str:
    text = _num(ours, fmt)
    if paper is not None:
        text += f" [dim]({_num(paper, fmt)})[/dim]"
    return text


def _tokens(value: Any) -> str:
    return "—" if value is None else f"{value / 1000:.1f}K"


def plan_table(result: PlanResult, reference: dict[str, Any] | None = None) -> Table:
    """Rows = metrics, columns = systems; the paper's figure in parentheses where known."""
    from rich.table import Table  # only when a table is drawn (start-up time)

    reference = reference or {}
    note = "; paper's figure in parentheses" if reference else ""
    table = Table(title=f"Throughput plan (mode: {result.mode}{note})")
    table.add_column("")
    for name in SYSTEMS:
        table.add_column(TITLES[name], justify="right")
    plans = [result.systems[n] for n in SYSTEMS]
    refs = [reference.get(n, {}) for n in SYSTEMS]

    def counts(p: Any) -> str:
        return " / ".join("—" if v is None else str(v) for v in (p.n_prfaas, p.n_p, p.n_d))

    def ref_counts(r: dict[str, Any]) -> str:
        if not r:
            return ""
        vals = (r.get("n_prfaas"), r.get("n_p"), r.get("n_d"))
        return " [dim](" + " / ".join("—" if v is None else str(v) for v in vals) + ")[/dim]"

    table.add_row("threshold t", *[
        _tokens(p.threshold_tokens) + (f" [dim]({_tokens(r['threshold_tokens'])})[/dim]"
                                        if "threshold_tokens" in r else "")
        for p, r in zip(plans, refs, strict=True)])
    table.add_row("N_prfaas / N_p / N_d",
                  *[counts(p) + ref_counts(r) for p, r in zip(plans, refs, strict=True)])
    for label, key in (("Θprfaas (req/s)", "theta_prfaas"), ("Θpd-p (req/s)", "theta_pd_p"),
                       ("Θpd-d (req/s)", "theta_pd_d"), ("Λmax (req/s)", "lambda_max")):
        table.add_row(label, *[_pair(getattr(p, key), r.get(key), ".2f")
                               for p, r in zip(plans, refs, strict=True)])
    base = result.systems["homogeneous_pd"].lambda_max
    table.add_row("throughput ratio", *[f"{p.lambda_max / base:.2f}x" for p in plans])
    if all(p.cost_per_hour for p in plans):
        per_cost = [p.lambda_max / (p.cost_per_hour or 1.0) for p in plans]
        table.add_row("throughput per cost", *[f"{v / per_cost[1]:.2f}x" for v in per_cost])
    table.add_row("offload fraction", *[_pair(p.offload_fraction, r.get("offload_fraction"),
                                              ".3f") for p, r in zip(plans, refs, strict=True)])
    table.add_row("E[L | L > t]", *[_tokens(p.l_long_tokens) + (
        f" [dim]({_tokens(r['l_long_tokens'])})[/dim]" if "l_long_tokens" in r else "")
        for p, r in zip(plans, refs, strict=True)])
    table.add_row("egress (Gbps)", *[_pair(p.egress_gbps, r.get("egress_gbps"), ".1f")
                                     for p, r in zip(plans, refs, strict=True)])
    table.add_row("TTFT mean / P90 (s), queue-free", *[
        f"{_num(p.ttft_mean_s, '.2f')} / {_num(p.ttft_p90_s, '.2f')}"
        + (f" [dim]({r['ttft_mean_s']:.2f} / {r['ttft_p90_s']:.2f})[/dim]"
           if "ttft_mean_s" in r else "") for p, r in zip(plans, refs, strict=True)])
    table.add_row("bottleneck", *[p.bottleneck for p in plans])
    return table


def plan_json(result: PlanResult) -> dict[str, Any]:
    return {"mode": result.mode,
            "systems": {name: result.systems[name].to_json() for name in SYSTEMS}}
