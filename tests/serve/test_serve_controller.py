"""Live: the threshold controller in the router (`cache-aware+controller` on the local topology).

The controller re-solves t from the measured profile (data/profiles/cpu-tiny.yaml), the
topology's link and its window of uncached lengths. With a window of 6 and a short period, the
t a request reports is, at known points, the planner's Eq. 7 solution for the previous 6
requests: after a long-heavy batch A and after a short-heavy batch B. Every request must route
by the t it reports (distinct random prompts: no prefix hits, uncached = prompt tokens).

The link carries fp8 KV (`link: {wire_dtype: fp8_e4m3}`): the controller plans with wire bytes,
and a second test checks a PrfaaS transfer through this deployment decodes exactly what the
engine decodes from fp8-round-tripped KV, within the measured error of the exact KV's logprobs.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from serve_helpers import complete, get_text

from prfaas.engine import SamplingParams, layer_kv_from_arrays
from prfaas.planner.search import PlanInputs
from prfaas.policy.controller import ControllerConfig, solve_threshold
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.router.plan import live_plan_inputs
from prfaas.serve.topology import Topology, load_topology
from prfaas.serve.worker.kvship import layer_arrays, meta_arrays
from prfaas.transport.quant import decode_arrays
from prfaas.workload.lengths import empirical

pytestmark = pytest.mark.timeout(600)

INITIAL_T = 1024
CONTROLLER = {"period_s": 0.5, "window_requests": 6, "min_window": 6, "agree_solves": 1,
              "min_rel_change": 0.0}
LONG_BATCH = (100, 200, 400, 700, 1200, 1600)  # prompt tokens, BOS included
SHORT_BATCH = (60, 90, 130, 200, 260, 350)


WIRE_QUALITY = Path(__file__).resolve().parents[2] / "benchmarks/results/wire_quality.json"


def _topology() -> Topology:
    topo = load_topology()  # the embedded local topology: 1 PrfaaS, 1 PD-P, 1 PD-D
    return replace(topo, router_port=0, policy="cache-aware+controller",
                   link=replace(topo.link, wire_dtype="fp8_e4m3"),
                   policy_args={"threshold_tokens": INITIAL_T, "controller": CONTROLLER},
                   workers=tuple(replace(w, port=0, kv_port=0) for w in topo.workers))


def _prompt(tokens: int, rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens - 1))


def _planner_t(inputs: PlanInputs, lengths: tuple[int, ...], link_gbps: float) -> int:
    cfg = ControllerConfig(**CONTROLLER)  # type: ignore[arg-type]
    solved = replace(inputs, lengths=empirical(list(lengths)),
                     link_gbps=link_gbps * cfg.link_headroom)
    return solve_threshold(solved, n_prfaas=1, n_p=1, mode=cfg.mode)


def _send(url: str, lengths: tuple[int, ...], rng: random.Random) -> list[dict[str, Any]]:
    replies = []
    for n in lengths:
        reply = complete(url, _prompt(n, rng), max_tokens=2)
        assert reply["usage"]["prompt_tokens"] == n
        replies.append(reply)
    return replies


@pytest.fixture(scope="module")
def dep() -> Iterator[Deployment]:
    with Deployment(_topology()) as d:
        yield d


def test_controller_moves_t_to_the_planners_solution_and_routes_by_it(dep: Deployment) -> None:
    topo = _topology()
    inputs = live_plan_inputs(topo)
    # planned with the link's fp8 bytes: a quarter of the fp32 cache's, plus the scales
    assert inputs.kv.per_token_bytes < 0.26 * live_plan_inputs(
        replace(topo, link=replace(topo.link, wire_dtype=None))).kv.per_token_bytes
    assert (inputs.n_prfaas, inputs.n_pd) == (1, 2)
    rate = topo.link.rate_gbps
    assert rate is not None
    t_long, t_short = _planner_t(inputs, LONG_BATCH, rate), _planner_t(inputs, SHORT_BATCH, rate)
    assert len({t_long, t_short, INITIAL_T}) == 3  # otherwise the test could not tell them apart
    probe_tokens = t_short + 100  # offloaded only under t_short
    assert probe_tokens <= min(t_long, INITIAL_T)
    rng = random.Random(7)
    first = _send(dep.url, LONG_BATCH, rng)
    time.sleep(CONTROLLER["period_s"] + 0.1)
    second = _send(dep.url, SHORT_BATCH, rng)
    time.sleep(CONTROLLER["period_s"] + 0.1)
    probe = _send(dep.url, (probe_tokens,), rng)
    metrics = get_text(f"{dep.url}/metrics")
    replies = first + second + probe
    for r in replies:  # routed by the t it reports, with no prefix hit
        p = r["prfaas"]
        assert p["cached_tokens"] == 0
        expected = "prfaas" if r["usage"]["prompt_tokens"] > p["threshold_tokens"] else "pd"
        assert p["route"] == expected, (r["usage"], p["threshold_tokens"], p["route"])
    ts = [r["prfaas"]["threshold_tokens"] for r in replies]
    assert ts[:6] == [INITIAL_T] * 6  # no solve before the window holds 6 lengths
    assert ts[6] == t_long  # solved on batch A when B's first request arrived
    assert ts[-1] == t_short  # solved on batch B when the probe arrived
    assert {r["prfaas"]["route"] for r in first} == {"pd", "prfaas"}
    assert probe[0]["prfaas"]["route"] == "prfaas"
    assert f"prfaas_threshold_tokens {float(t_short)}" in metrics
    assert 'prfaas_kv_bytes_total{link="inter_dc"}' in metrics


def _fp8_kv(engine: Any, ids: list[int]) -> tuple[Any, Any]:
    """What the decode worker holds after an fp8 transfer: the prefill's layers through
    kvship.layer_arrays (fp8 for full attention) and quant.decode_arrays, then import_kv."""
    result = engine.prefill(ids)
    layers = []
    for i in range(engine.config.num_layers):
        layer = result.kv.export_layer(i, 0, len(ids))
        arrays = {n: a for n, a in layer_arrays(layer, "fp8_e4m3") if n != "range"}
        layers.append(layer_kv_from_arrays(i, layer.kind, layer.start_token, layer.end_token,
                                           sorted(decode_arrays(arrays).items())))
    return engine.import_kv(layers, None, ids), result.logits


def _logprob_rows(engine: Any, kv: Any, logits: Any, ids: list[int], tokens: list[int]
                  ) -> list[torch.Tensor]:
    seq = engine.start(kv, logits, SamplingParams(ignore_eos=True), ids)
    rows = [torch.log_softmax(logits, -1)]
    for token in tokens[:-1]:
        seq.last_token = token
        rows.append(torch.log_softmax(engine.decode_logits([seq])[0], -1))
    return rows


def test_fp8_transfer_decodes_what_fp8_kv_gives(dep: Deployment, engine: Any) -> None:
    """Live tokens and logprobs equal the engine's on fp8-round-tripped KV (same arithmetic,
    batch-invariant decode: bitwise); against the exact KV they differ (fp8 really crossed),
    by no more than the benchmark measured for fp8 on this engine (wire_quality.json)."""
    rng = random.Random(11)
    prompt = _prompt(1800, rng)  # above every t the controller can reach: PrfaaS route
    reply = complete(dep.url, prompt, max_tokens=16, logprobs=1, ignore_eos=True)
    assert reply["prfaas"]["route"] == "prfaas", reply["prfaas"]
    tokens, ids = reply["prfaas"]["token_ids"], engine.tokenizer.encode(prompt)
    assert len(tokens) == 16
    kv, logits = _fp8_kv(engine, ids)
    fp8_rows = _logprob_rows(engine, kv, logits, ids, tokens)
    assert tokens == [int(r.argmax()) for r in fp8_rows]  # greedy on the fp8 KV
    live_lp = reply["choices"][0]["logprobs"]["token_logprobs"]
    assert live_lp == [float(r[t]) for r, t in zip(fp8_rows, tokens, strict=True)]
    exact = engine.prefill(ids)
    # the bytes shipped are the fp8 layers' (codes + scales; linear states as they are) + meta
    n = len(ids)
    layers = [exact.kv.export_layer(i, 0, n) for i in range(engine.config.num_layers)]
    fp8_bytes = sum(a.nbytes for layer in layers for _, a in layer_arrays(layer, "fp8_e4m3"))
    fp32_bytes = sum(a.nbytes for layer in layers for _, a in layer_arrays(layer))
    meta = sum(a.nbytes for *_, a in meta_arrays(exact.kv, exact.logits, 0, n,
                                                  engine.config.block_size_tokens))
    assert reply["prfaas"]["kv_bytes"] == fp8_bytes + meta
    assert fp8_bytes < fp32_bytes
    exact_rows = _logprob_rows(engine, exact.kv, exact.logits, ids, tokens)  # (extends exact.kv)
    diff = max(float((a - b).abs().max()) for a, b in zip(fp8_rows, exact_rows, strict=True))
    measured = json.loads(WIRE_QUALITY.read_text())["presets"]["tiny (KDA:MLA 3:1)"]
    bound = measured["variants"]["fp8_e4m3"]["max_abs_err_logprob_any_token"]
    assert 0 < diff <= bound, (diff, bound)
