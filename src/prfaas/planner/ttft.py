"""Queue-free TTFT: prefill service time plus KV transfer, over the length distribution.

This is what the paper's Table 6 TTFT figures match (REFERENCE.md section 4): no queueing.
A request of length l routed to PrfaaS (l > t) takes T_prfaas(l) + S_kv(l) / B_link; one kept
local takes T_pd(l) + S_kv(l) / B_intra (+ the link's RTT for PrfaaS, models/tcp.py). The link
rate is the whole link (an idle link), or one transfer's TCP cap when lower: a lower bound,
labelled as such wherever it is printed. Queueing TTFT comes from the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from prfaas.planner.search import PlanInputs

GBPS = 1e9 / 8


def ttft_stats(inputs: PlanInputs, threshold: int | None, local_only: bool = False
               ) -> tuple[float, float]:
    """(mean, P90) queue-free TTFT in seconds. threshold None + local_only: all local;
    threshold -1: all remote."""
    lengths = inputs.lengths
    support = lengths.support
    kv = inputs.kv.size_bytes(support)
    with np.errstate(divide="ignore"):  # a 0 Gbps link: +inf, and then no request is remote
        remote = inputs.prfaas_prefill.time_s(support) + kv / (inputs.link_gbps * GBPS)
    if inputs.link_rtt_s > 0:
        remote = remote + inputs.link_rtt_s
    local = inputs.pd_prefill.time_s(support) + kv / (inputs.intra_gbps * GBPS)
    if local_only:
        ttft = local
    else:
        t = -1 if threshold is None else threshold
        side = lengths.split([t])  # a side below PROB_TOL holds no request (lengths.py)
        if side.p_above[0] == 0:
            ttft = local
        elif side.p_below[0] == 0:
            ttft = remote
        else:
            ttft = np.where(support > t, remote, local)
    mean = float(np.dot(lengths.pmf, ttft))
    order = np.argsort(ttft, kind="stable")
    cdf = np.cumsum(lengths.pmf[order])
    p90_index = min(int(np.searchsorted(cdf, 0.9)), cdf.size - 1)
    p90 = float(ttft[order][p90_index])
    return mean, p90
