"""Property: over random valid planner inputs, `search_prfaas_pd` returns a plan whose figures
are finite and whose throughput is the model's maximum over the grid, or an InfeasibleError that
names the binding constraint and that is truly infeasible.

Both claims are checked against `_brute`, an evaluation of Eqs 3-6 at every grid point written
here from the paper's formulas: masked sums over the pmf (no prefix sums, no `split`, no
`bounds`, no `stage_curves`), so it shares no code with the search's filtering.

Examples: PRFAAS_PROPERTY_EXAMPLES (default 150 for CI, ~20 s; the report ran 500).
PRFAAS_PROPERTY_LOG=path appends one JSON line per example (outcome, figures, constraint).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prfaas.core.errors import InfeasibleError
from prfaas.models.catalog import catalog
from prfaas.models.kv import geometry
from prfaas.models.profile import DecodeTime, KVSize, PrefillTime
from prfaas.models.roofline import GPUS, roofline_profile
from prfaas.planner.search import PlanInputs, SystemPlan, search_prfaas_pd
from prfaas.workload.lengths import empirical, fixed, truncated_lognormal

EXAMPLES = int(os.environ.get("PRFAAS_PROPERTY_EXAMPLES", "150"))
LOG = os.environ.get("PRFAAS_PROPERTY_LOG")
MODELS = sorted(catalog())
EMPTY_SIDE = 1e-12  # the spec's tolerance (docs/planner.md), written here, not imported
GBPS = 1e9 / 8
# The planner (prefix/suffix sums) and `_brute` (pairwise masked sums) add the same terms in
# different orders: <= n 2^-53 relative each (1.5e-11 for n = 2^17), a few more roundings in
# the rate formulas; and the search accepts any point within 1e-9 of its maximum.
AGREE_REL = 1e-9 + 1e-10


@st.composite
def lengths_st(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["lognormal", "lognormal", "lognormal", "empirical", "fixed"]))
    if kind == "fixed":
        return fixed(draw(st.integers(1, 131072)))
    if kind == "empirical":
        return empirical(draw(st.lists(st.integers(1, 65536), min_size=1, max_size=200)))
    lo = draw(st.integers(1, 4096))
    hi = draw(st.integers(lo, 131072))
    log_median = draw(st.floats(math.log(lo) - 1.0, math.log(hi) + 1.0))
    sigma = draw(st.floats(0.05, 3.0))
    return truncated_lognormal(round(log_median, 4), round(sigma, 4), lo, hi)


@st.composite
def prefill_st(draw: st.DrawFn, model: Any) -> PrefillTime:
    if model is not None and model.params_active_b is not None and draw(st.booleans()):
        return roofline_profile(model, draw(st.sampled_from(sorted(GPUS))),
                                draw(st.sampled_from([1, 2, 4, 8])),
                                draw(st.floats(0.1, 0.9)), draw(st.floats(0.0, 1.0))).prefill
    return PrefillTime(draw(st.floats(0.0, 1e-9)), draw(st.floats(1e-7, 1e-3)),
                       draw(st.floats(0.0, 1.0)))


@st.composite
def inputs_st(draw: st.DrawFn) -> tuple[PlanInputs, str]:
    model = catalog()[draw(st.sampled_from(MODELS))] if draw(st.booleans()) else None
    kv = (KVSize.from_geometry(geometry(model)) if model is not None
          else KVSize(draw(st.floats(0.0, 1e9)), draw(st.floats(1e3, 1e6))))
    lengths = draw(lengths_st())
    prfaas = draw(prefill_st(model))
    pd = (prfaas.scaled(draw(st.floats(0.2, 10.0))) if draw(st.booleans())
          else draw(prefill_st(model)))
    span = lengths.hi - lengths.lo
    step = max(draw(st.sampled_from([1, 10, 50, 100, 500, 1000, 4096])), -(-span // 300), 1)
    inputs = PlanInputs(
        lengths=lengths, output_tokens=draw(st.integers(1, 8192)), kv=kv,
        prfaas_prefill=prfaas, pd_prefill=pd,
        decode=DecodeTime(draw(st.integers(1, 256)), draw(st.floats(0.002, 0.2))),
        n_prfaas=draw(st.integers(0, 8)), n_pd=draw(st.integers(1, 16)),
        link_gbps=0.0 if draw(st.integers(0, 9)) == 0 else draw(st.floats(0.01, 1000.0)),
        intra_gbps=draw(st.floats(10.0, 3200.0)), t_step_tokens=step,
        link_rtt_s=draw(st.floats(0.0, 0.1)))
    return inputs, draw(st.sampled_from(["paper", "exact"]))


def _grid(lo: int, hi: int, step: int) -> np.ndarray:
    inner = [t for t in range(-(-lo // step) * step, hi, step)]
    return np.array(sorted({max(lo - 1, 0), *inner, hi}), dtype=float)


def _brute(inputs: PlanInputs, mode: str) -> tuple[np.ndarray, set[str]]:
    """lam[n_p, i] at every grid threshold and split, and the stages found at 0 somewhere."""
    d = inputs.lengths
    lengths = d.lo + np.arange(d.pmf.size, dtype=float)
    t_long = inputs.prfaas_prefill.time_s(lengths)
    t_short = inputs.pd_prefill.time_s(lengths)
    step_s = inputs.decode.step_at(inputs.decode.bs_max)
    ts = _grid(d.lo, d.hi, inputs.t_step_tokens)
    lam = np.zeros((inputs.n_pd, ts.size))
    zero: set[str] = set()
    for i, t in enumerate(ts):
        long = lengths > t
        p_long, p_short = float(d.pmf[long].sum()), float(d.pmf[~long].sum())
        p_long, p_short = (0.0 if p_long < EMPTY_SIDE else p_long,
                           0.0 if p_short < EMPTY_SIDE else p_short)
        prf_term = math.inf
        if p_long > 0:
            mean_l = float((d.pmf[long] * lengths[long]).sum()) / p_long
            service = (float(inputs.prfaas_prefill.time_s(mean_l)) if mode == "paper"
                       else float((d.pmf[long] * t_long[long]).sum()) / p_long)
            kv = inputs.kv.bytes_for(mean_l)
            rate = min(inputs.n_prfaas / service, inputs.link_gbps * GBPS / kv)
            prf_term = rate / p_long
            zero |= {"prfaas"} if rate <= 0 else set()
        for n_p in range(inputs.n_pd):
            pdp_term = math.inf
            if p_short > 0:
                mean_s = float((d.pmf[~long] * lengths[~long]).sum()) / p_short
                service = (float(inputs.pd_prefill.time_s(mean_s)) if mode == "paper"
                           else float((d.pmf[~long] * t_short[~long]).sum()) / p_short)
                pdp_term = n_p / service / p_short
                zero |= {"pd_p"} if n_p == 0 else set()
            decode = (inputs.n_pd - n_p) * inputs.decode.bs_max / (step_s * inputs.output_tokens)
            lam[n_p, i] = min(prf_term, pdp_term, decode)
    return lam, zero


FIGURES = ("lambda_max", "theta_prfaas", "theta_pd_p", "theta_pd_d", "offload_fraction",
           "l_long_tokens", "l_short_tokens", "egress_gbps", "ttft_mean_s", "ttft_p90_s")


def check_plan_or_error(inputs: PlanInputs, mode: str, search: Any = search_prfaas_pd
                        ) -> dict[str, Any]:
    """The property; raises AssertionError (or the search's own unexpected exception)."""
    lam, zero = _brute(inputs, mode)
    truth = float(lam.max())
    assert not np.isnan(lam).any()
    try:
        plan: SystemPlan = search(inputs, mode)
    except InfeasibleError as err:
        assert "binding constraint" in str(err) or "instances=0" in str(err), err
        assert not truth > 0, f"false infeasible: the grid holds lambda={truth:.6g} ({err})"
        named = {k for k, word in (("prfaas", "PrfaaS side"), ("pd_p", "PD-P side"))
                 if word in str(err)}
        assert named == zero, (named, zero)
        return {"outcome": "infeasible", "error": str(err)}
    values = {k: getattr(plan, k) for k in FIGURES}
    assert all(v is None or math.isfinite(v) for v in values.values()), values
    assert plan.lambda_max > 0 and truth > 0
    assert plan.lambda_max == pytest.approx(truth, rel=AGREE_REL), (plan.lambda_max, truth)
    p = plan.offload_fraction
    assert p is not None and 0.0 <= p <= 1.0
    assert plan.threshold_tokens is not None
    assert inputs.lengths.lo - 1 <= plan.threshold_tokens <= inputs.lengths.hi
    assert plan.egress_gbps is not None and plan.egress_gbps <= inputs.link_gbps * (1 + 1e-9)
    return {"outcome": "plan", **values}


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(inputs_st())
def test_every_plan_is_finite_and_optimal_or_truly_infeasible(case: tuple[PlanInputs, str]
                                                              ) -> None:
    inputs, mode = case
    record = check_plan_or_error(inputs, mode)
    if LOG:
        with open(LOG, "a") as fh:
            fh.write(json.dumps({**record, "mode": mode, "n_prfaas": inputs.n_prfaas,
                                 "n_pd": inputs.n_pd, "link_gbps": inputs.link_gbps,
                                 "lengths": inputs.lengths.name}) + "\n")


# Negative controls: the property catches what the old planner did.

def _tiny() -> PlanInputs:
    """The tiny emulated scenario's inputs (tests/emulated/tiny_scenario.py), where the old
    planner read P(L > 8192) = 4.4e-16 and raised a false InfeasibleError."""
    fast = PrefillTime.fit([1000, 4000, 16000], [0.2, 0.5, 2.0])
    return PlanInputs(truncated_lognormal(8.0, 0.6, 256, 8192), 16,
                      KVSize.fit([1000, 10000], [2.0e6, 1.1e7]), fast, fast.scaled(3.0),
                      DecodeTime(4, 0.02), 1, 2, 10.0, t_step_tokens=100)


def test_the_tiny_scenario_that_failed_is_planned() -> None:
    assert check_plan_or_error(_tiny(), "exact")["outcome"] == "plan"


def test_negative_control_a_false_infeasible_is_caught() -> None:
    def old_behaviour(inputs: PlanInputs, mode: str) -> SystemPlan:
        raise InfeasibleError("no threshold and split gives a positive throughput; "
                              "binding constraint: PrfaaS side Θprfaas = 0")

    with pytest.raises(AssertionError, match="false infeasible"):
        check_plan_or_error(_tiny(), "exact", old_behaviour)


def test_negative_control_a_nan_figure_or_a_suboptimal_plan_is_caught() -> None:
    good = search_prfaas_pd(_tiny(), "exact")
    with pytest.raises(AssertionError):
        check_plan_or_error(_tiny(), "exact", lambda i, m: replace(good, ttft_p90_s=math.nan))
    with pytest.raises(AssertionError):
        check_plan_or_error(_tiny(), "exact",
                            lambda i, m: replace(good, lambda_max=good.lambda_max * (1 - 1e-6)))
