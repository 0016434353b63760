"""Summaries of a load run: latency percentiles, throughput, routes, KV bytes, router overhead."""

from __future__ import annotations

from typing import Any

import numpy as np

from prfaas.bench.loadgen import Result


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    routes: dict[str, int] = {}
    kv_bytes: dict[str, int] = {}
    for r in ok:
        route = str(r.prfaas.get("route", "?"))
        routes[route] = routes.get(route, 0) + 1
        kv_bytes[route] = kv_bytes.get(route, 0) + int(r.prfaas.get("kv_bytes", 0))
    router_s = [float(r.prfaas["router_overhead_s"]) for r in ok if "router_overhead_s" in r.prfaas]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    fractions = [float(r.prfaas["router_overhead_s"]) / r.e2e_s for r in ok
                 if r.e2e_s and "router_overhead_s" in r.prfaas]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "first_errors": [r.error for r in results if not r.ok][:3],
        "wall_s": wall_s,
        "throughput": {"requests_per_s": len(ok) / wall_s if wall_s else 0.0,
                       "output_tokens_per_s": out_tokens / wall_s if wall_s else 0.0,
                       "input_tokens_per_s": sum(r.input_bytes + 1 for r in ok) / wall_s
                       if wall_s else 0.0},
        "ttft_s": stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": stats([t for r in ok if (t := r.tpot_s) is not None]),
        "e2e_s": stats(e2e),
        "router_overhead_s": stats(router_s),
        "router_overhead_fraction_of_e2e": stats(fractions),
        "routes": routes, "kv_bytes_by_route": kv_bytes,
        "retried": sum(1 for r in ok if r.prfaas.get("retried")),
        "cached_tokens": sum(int(r.prfaas.get("cached_tokens", 0)) for r in ok),
        "input_tokens": {"mean": float(np.mean([r.input_bytes + 1 for r in results]))
                         if results else 0.0},
    }


def render(summary: dict[str, Any]) -> str:
    def ms(block: dict[str, float | None], key: str) -> str:
        v = block.get(key)
        return "-" if v is None else f"{v * 1e3:.1f}"

    lines = [f"requests {summary['ok']}/{summary['requests']} ok in {summary['wall_s']:.1f} s; "
             f"routes {summary['routes']}; retried {summary['retried']}",
             f"throughput {summary['throughput']['requests_per_s']:.2f} req/s, "
             f"{summary['throughput']['output_tokens_per_s']:.1f} output tok/s"]
    for key in ("ttft_s", "tpot_s", "e2e_s", "router_overhead_s"):
        b = summary[key]
        lines.append(f"{key[:-2]:<16} mean {ms(b, 'mean'):>8} ms  p50 {ms(b, 'p50'):>8}  "
                     f"p90 {ms(b, 'p90'):>8}  p99 {ms(b, 'p99'):>8}")
    frac = summary["router_overhead_fraction_of_e2e"]["mean"]
    if frac is not None:
        lines.append(f"router overhead = {frac * 100:.3f}% of end-to-end time (mean)")
    return "\n".join(lines)
