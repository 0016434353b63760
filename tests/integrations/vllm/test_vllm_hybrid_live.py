"""Live: the hybrid tiny Qwen3-Next (3 Gated DeltaNet : 1 full attention, MoE) behind prfaas.

The PrfaaS instance stops one token short of each prompt and sends the attention KV layer by
layer, then each GDN layer's conv + recurrent state h(N-1), over its shaped link; the decoder
recomputes token N from them. bf16 near-ties make greedy equality the wrong test for random
weights, so the check is on logprobs: the first token's and 32 teacher-forced ones (each
request of the chain forces the reference's prefix through a new transfer: every compared
logprob was computed from transferred state) against a single-instance run.

The tolerance is measured, not chosen: the single instance's own chunking noise on the same
prompts (its 32 continuation logprobs computed token by token while decoding, and again inside
a prefill chunk as prompt logprobs of prompt + continuation), the largest gap times SAFETY.
Negative controls: the same comparison with a zeroed GDN recurrent state, another request's
conv state, or KV blocks shifted by one (injected at the receiver, params.FAULTS) must fail it.
The conv-state layout is vLLM's choice for this CPU (SD on AVX-512-BF16); run the module with
VLLM_SSM_CONV_STATE_LAYOUT=DS in the environment for the other one.

The deployment publishes vLLM's KV cache events (`vllm.kv_events` on in this module's copy of
the topology; pdp-0's cache cut to 64 blocks): the router's count of a hybrid prefix on pdp-0
is held against vLLM's own `cached_tokens`, before and after vLLM evicts it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from needs import needs

pytestmark = needs("vllm")

from vllm_live import (  # noqa: E402
    ROOT,
    EventTap,
    ExtraRouter,
    build,
    deployment,
    event_counts,
    post,
    process_tree,
    prompts,
    routed,
    text_prompts,
    topology,
    trace,
    workdir,
)

NUM_TOKENS = 32
# A stated margin over the measured noise: the P/D path adds one more chunk boundary (token N
# alone from h(N-1)) to the prompt's own, so its gap is of the noise's kind and size.
SAFETY = 4.0
# The decoder recomputes token N alone from h(N-1) and the KV of N-1 tokens. A single instance
# does the same step only when the prompt's last chunk is that one token: lengths 1024k + 1
# with max_num_batched_tokens 1024. Other lengths compute token N inside the last chunk, and
# the P/D first token then differs by up to ~1e-2 in logprob, for vLLM's own NixlConnector
# exactly as for ours (docs/vllm.md: same prompts, same values to the last bit).
ALIGNED = [1025, 1025, 1025, 1025, 2049, 2049, 2049, 3073, 3073, 3073]
ANY_LENGTH = [200, 300, 500, 700, 900, 1100, 1300, 1600, 2000, 2500]
CONTROL = [1025, 1300]  # one aligned length, one not
FAULTS = ("zero_state", "foreign_conv", "shift_blocks")
# Each control runs on prompts the decoder has never seen (seed 18, 19, 20): a prompt it had
# already served would be a local prefix-cache hit, and nothing (no fault) would cross.
CONTROL_SEEDS = {None: 17, **{f: 18 + i for i, f in enumerate(FAULTS)}}


@pytest.fixture(scope="module")
def live() -> Iterator[dict[str, Any]]:
    with workdir("vllm-hybrid") as root:
        yield from _live(root)


PDP_BLOCKS = 64  # pdp-0's KV cache (--num-gpu-blocks-override): its evictions are shown


def _live(root: Path) -> Iterator[dict[str, Any]]:
    """vllm-local.yaml's deployment with the instances' KV events on (the router's prefix
    state comes from them) and pdp-0's cache cut to PDP_BLOCKS blocks of 256 tokens."""
    model = build("qwen3_next", root)
    topo = topology("vllm-local.yaml", model)
    assert topo.vllm is not None
    topo = dataclasses.replace(
        topo, vllm=dataclasses.replace(topo.vllm, kv_events=True), workers=tuple(
            dataclasses.replace(w, vllm_args=(*w.vllm_args, "--num-gpu-blocks-override",
                                              str(PDP_BLOCKS))) if w.name == "pdp-0" else w
            for w in topo.workers))
    with deployment(topo, root / "logs") as (dep, ref, traces):
        yield {"dep": dep, "ref": ref, "traces": traces, "single": {}, "errors": {},
               "logs": root / "logs", "model": model}


def _choice(reply: dict[str, Any]) -> tuple[list[int], list[float], list[dict[str, float]]]:
    c = reply["choices"][0]
    lp = c["logprobs"]
    return c["token_ids"], lp["token_logprobs"], lp["top_logprobs"]


def single(live: dict, prompt: list[int], n: int = NUM_TOKENS) -> tuple[list[int], list[float]]:
    """The single instance's greedy continuation and its logprobs (decoded token by token)."""
    key = (tuple(prompt), n)
    if key not in live["single"]:
        status, reply = post(live["ref"].spec.url, {
            "model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "return_token_ids": True, "logprobs": 1})
        assert status == 200, reply
        ids, lps, _ = _choice(reply)
        live["single"][key] = (ids, lps)
    return live["single"][key]


def in_chunk(live: dict, prompt: list[int], continuation: list[int]) -> list[float]:
    """The same instance's logprobs of `continuation`, computed inside prefill chunks (prompt
    logprobs of prompt + continuation) instead of one decode step per token."""
    status, reply = post(live["ref"].spec.url, {
        "model": "tiny", "prompt": prompt + continuation, "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": 1})
    assert status == 200, reply
    entries = reply["choices"][0]["prompt_logprobs"][len(prompt):]
    return [float(e[str(t)]["logprob"]) for e, t in zip(entries, continuation, strict=True)]


_tid = iter(range(10**6, 2 * 10**6))


def disaggregated(live: dict, prompt: list[int], n: int, fault: str | None = None,
                  send: dict[str, Any] | None = None
                  ) -> tuple[list[int], list[float], list[dict[str, float]]] | None:
    """Prefill on the PrfaaS instance, decode on PD-D, sent at once (the router's bodies).
    `send`: more `kv_transfer_params.prfaas` keys for the prefill (e.g. its wire dtype)."""
    dep = live["dep"]
    pre, dec = dep.topology.worker("prfaas-0"), dep.topology.worker("pdd-0")
    tid = next(_tid)
    live.setdefault("tids", []).append(tid)
    base = {"model": "tiny", "prompt": prompt, "temperature": 0, "return_token_ids": True}
    recv: dict[str, Any] = {"role": "recv", "transfer_id": tid}
    if fault is not None:
        recv["fault"] = fault
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(p=post(pre.url, {
        **base, "max_tokens": 1, "kv_transfer_params": {"prfaas": {
            "role": "send", "transfer_id": tid, "dest_host": dec.host,
            "dest_port": dec.kv_port, **(send or {})}}})))
    thread.start()
    status, reply = post(dec.url, {**base, "max_tokens": n, "logprobs": 5,
                                   "return_tokens_as_token_ids": True,
                                   "kv_transfer_params": {"prfaas": recv}})
    thread.join(300)
    assert out["p"][0] == 200, out["p"]
    done = [e for e in trace(live["traces"], "pdd-0") if e["ev"] == "done" and e["tid"] == tid]
    assert done and done[0]["error"] is None, done  # the KV and the states did cross
    if status == 400 and "Out of range float" in str(reply) and fault is not None:
        return None  # the logprobs came out NaN/inf: vLLM cannot even serialize them
    assert status == 200, reply
    return _choice(reply)


def _lp_of(top: dict[str, float], token: int) -> float | None:
    return top.get(f"token_id:{token}")


def error(live: dict, prompt: list[int], fault: str | None = None,
          stop_above: float = float("inf"), send: dict[str, Any] | None = None,
          segments: int = NUM_TOKENS) -> tuple[float, float, int]:
    """(first token's |dlogprob|, worst of the 32 teacher-forced ones, forced re-sends) of the
    P/D path against the single instance; a reference token outside the decoder's top 5 counts
    as an infinite error. `stop_above`: stop once the worst exceeds it (it can only grow).
    `segments`: at most this many requests (1: only the first transfer's greedy run up to and
    including its first divergence; no re-send, whose prompt would not keep an aligned length)."""
    ref_ids, ref_lps = single(live, prompt)
    got: list[float] = []
    pos, forced, first = 0, 0, float("inf")
    while pos < NUM_TOKENS:  # teacher forcing: re-send with the reference's prefix
        reply = disaggregated(live, prompt + ref_ids[:pos], NUM_TOKENS - pos, fault, send)
        if reply is None:  # non-finite logprobs: the comparison fails outright
            return float("inf") if pos == 0 else first, float("inf"), forced
        ids, lps, tops = reply
        forced += pos > 0
        k = 0
        while k < len(ids) and pos + k < NUM_TOKENS and ids[k] == ref_ids[pos + k]:
            got.append(lps[k])
            k += 1
        if pos + k < NUM_TOKENS:  # diverged (a near-tie, or wrong data): the reference token
            lp = _lp_of(tops[k], ref_ids[pos + k])
            got.append(float("-inf") if lp is None else lp)
            k += 1
        if pos == 0:
            first = abs(got[0] - ref_lps[0])
        pos += k
        if max(abs(a - b) for a, b in zip(got, ref_lps, strict=False)) > stop_above:
            break
        if forced + 1 >= segments:
            break
    worst = max(abs(a - b) for a, b in zip(got, ref_lps, strict=False))
    return first, worst, forced


@pytest.fixture(scope="module")
def tolerance(live: dict) -> float:
    """SAFETY x the single instance's largest chunking gap over every compared prompt."""
    gaps = []
    sets = [(ALIGNED, 13), (ANY_LENGTH, 11), *((CONTROL, s) for s in CONTROL_SEEDS.values())]
    for lengths, seed in sets:
        for prompt in prompts(lengths, seed=seed):
            ids, lps = single(live, prompt)
            chunked = in_chunk(live, prompt, ids)
            gaps.append(max(abs(a - b) for a, b in zip(lps, chunked, strict=True)))
    tol = SAFETY * max(gaps)
    print(f"\nsingle-instance chunking noise: max {max(gaps):.2e} over {len(gaps)} prompts "
          f"(median {sorted(gaps)[len(gaps) // 2]:.2e}; all {[f'{g:.1e}' for g in gaps]}); "
          f"tolerance {SAFETY:g} x = {tol:.2e}")
    live["errors"]["noise"] = max(gaps)
    assert 0 < max(gaps) < 1.0, gaps  # measured something, and not garbage
    return tol


def _genuine(live: dict, lengths: list[int], seed: int, tol: float, name: str) -> None:
    rows = [error(live, prompt) for prompt in prompts(lengths, seed=seed)]
    firsts = [r[0] for r in rows]
    worst = max(r[1] for r in rows)
    print(f"\n{name}: first-token |dlogprob| {[f'{f:.1e}' for f in firsts]}; teacher-forced "
          f"max {worst:.2e} ({sum(r[2] for r in rows)} forced re-sends); tolerance {tol:.2e}")
    live["errors"][name] = worst
    assert max(firsts) < tol, firsts
    assert worst < tol, worst


def test_hybrid_state_crosses_and_logprobs_match_the_single_instance(
        live: dict, tolerance: float) -> None:
    _genuine(live, ALIGNED, 13, tolerance, "genuine aligned")


def test_hybrid_any_length_stays_within_the_chunking_noise(live: dict, tolerance: float) -> None:
    _genuine(live, ANY_LENGTH, 11, tolerance, "genuine any length")


# Measured 2026-12-01 (AVX-512-BF16 host): a zeroed GDN recurrent state moved the logprobs by
# only 7.9e-3 (both prompts; the genuine transfer: 0.0 and 7.9e-3), the size of the single
# instance's own median chunking noise: this random-weight tiny model's output hardly depends
# on the recurrent state, so a comparison within that noise cannot see it. Kept, strict: it
# fails loudly (XPASS) once a model or check can tell a zeroed state from a genuine one within
# the noise; at aligned lengths the exact comparison below does catch it.
ZERO_STATE_UNSEEN = pytest.mark.xfail(strict=True, reason="the tiny model's logprobs barely "
                                      "depend on the GDN recurrent state (7.9e-3, at the noise)")


@pytest.mark.parametrize("fault", [pytest.param("zero_state", marks=ZERO_STATE_UNSEEN),
                                   "foreign_conv", "shift_blocks"])
def test_wrong_state_or_kv_fails_the_same_comparison(live: dict, tolerance: float,
                                                     fault: str) -> None:
    """Each negative control fails on every prompt; the genuine transfer passes on prompts of
    the same lengths (the decoder's first sight of each prompt, as for the controls)."""
    if "control_genuine" not in live:
        live["control_genuine"] = [error(live, p)[1]
                                   for p in prompts(CONTROL, seed=CONTROL_SEEDS[None])]
    genuine = live["control_genuine"]
    wrong = [error(live, p, fault, stop_above=tolerance)[1]
             for p in prompts(CONTROL, seed=CONTROL_SEEDS[fault])]
    print(f"\n{fault}: error {[f'{w:.2e}' for w in wrong]} vs genuine "
          f"{[f'{g:.2e}' for g in genuine]} (tolerance {tolerance:.2e})")
    live["errors"][fault] = min(wrong)
    assert max(genuine) < tolerance, genuine
    assert min(wrong) > tolerance, wrong


# At lengths 1024k + 1 the decoder's step (token N alone from h(N-1) and the KV of N-1 tokens)
# is the single instance's own last chunk: the same vLLM kernels on the same inputs on this CPU,
# so a genuine transfer is bit-exact (vLLM against itself, not against another library: measured
# 0.0 on every ALIGNED prompt, first token and all teacher-forced ones). That exactness is what
# the noise-derived tolerance above cannot use, and what a zeroed recurrent state breaks.
EXACT_SEEDS = {None: 41, "zero_state": 42, "foreign_conv": 43}


@pytest.mark.parametrize("fault", ["zero_state", "foreign_conv"])
def test_at_aligned_lengths_the_transfer_is_exact_and_a_wrong_state_is_not(
        live: dict, fault: str) -> None:
    """Genuine: 0.0 on an unseen aligned prompt; the control on another unseen one: > 0."""
    [genuine_prompt] = prompts([2049], seed=EXACT_SEEDS[None] + len(fault))
    [wrong_prompt] = prompts([2049], seed=EXACT_SEEDS[fault])
    genuine = error(live, genuine_prompt)[1]
    wrong = error(live, wrong_prompt, fault, stop_above=0.0)[1]
    print(f"\naligned exact, {fault}: error {wrong:.2e} vs genuine {genuine:.2e}")
    live["errors"][f"{fault} (aligned, exact)"] = wrong
    assert genuine == 0.0, genuine
    assert wrong > 0.0, wrong


# fp8 on the wire (PrfaasConnector, wire_quant.py): the attention KV crosses as e4m3 codes with
# per-16-token-per-head scales, the GDN states as they are. Compared at aligned lengths only
# (1024k + 1), where the bf16 transfer is bit-exact against the single instance (the test above),
# and on the first transfer's greedy run only (up to and including its first divergence; a
# forced re-send would not keep the aligned length): so the error is fp8's alone, with no
# chunking noise in it, on every host. Prompts are held-out stdlib docstrings.
# - Upper bound: FP8_MARGIN x the largest fp8 error the benchmark measured on this model against
#   the same P/D path with bf16 on the wire (bench_vllm_wire_quality.py -> vllm_wire_quality.json).
#   That maximum sits at near-tie positions where fp8 flips the greedy token, so the bound is
#   loose: it says fp8 stays within what was measured, not that a coarser quantizer would fail it.
# - The negative control: fp8 decoded at twice its scales (`fp8_wrong_scale`), on prompts of its
#   own at the same aligned lengths (the decoder's prefix cache would skip a repeated prompt's
#   transfer), must come out worse than every genuine fp8 transfer here. int4 with one scale per
#   tensor is measured and printed, not asserted: the benchmark separates it from fp8 on the
#   mean over 20 prompts, but on qwen3_next fp8's worst position is above int4's (near-ties,
#   docs/wire-format.md), so on two prompts their worst errors need not order.
FP8_MARGIN = 2.0
FP8_SEED = 61
QUALITY = ROOT / "benchmarks" / "results" / "vllm_wire_quality.json"


def _measured_fp8_max() -> float:
    data = json.loads(QUALITY.read_text())
    [run] = [r for label, r in data["presets"].items() if "qwen3_next" in label]
    return float(run["variants"]["fp8_e4m3"]["teacher_logprob_abs_err"]["max"])


def test_fp8_on_the_wire_stays_within_its_measured_error_and_a_wrong_scale_does_not(
        live: dict) -> None:
    from prfaas.integrations.vllm.profile import connector_kv_bytes
    from prfaas.integrations.vllm.served_model import ServedModel

    fp8 = {"wire_dtype": "fp8_e4m3"}
    bound = FP8_MARGIN * _measured_fp8_max()
    genuine = text_prompts(live["model"], [2049, 1025], seed=FP8_SEED)
    rows = [error(live, p, send=fp8, segments=1) for p in genuine]
    tid = live["tids"][-2]  # the 2049-token prompt's transfer (one request per prompt)
    events = [e for e in trace(live["traces"], "pdd-0") if e["tid"] == tid]
    names = {e["name"] for e in events if e["ev"] == "tensor"}
    assert {"b0", "b0.scale", "s0"} <= names, names  # codes, scales, GDN state as it is
    [done] = [e for e in events if e["ev"] == "done"]
    model = ServedModel.from_settings(live["dep"].topology.vllm)
    assert done["error"] is None
    assert done["bytes"] == connector_kv_bytes(model, len(genuine[0]), "fp8_e4m3")
    assert done["bytes"] < connector_kv_bytes(model, len(genuine[0]))
    # the controls on prompts of their own, at the same aligned lengths: the decoder caches the
    # prefixes it has seen, so the same prompt again would not cross at all
    others = text_prompts(live["model"], [2049, 1025], seed=FP8_SEED + 1)
    wrong = [error(live, p, "fp8_wrong_scale", send=fp8, segments=1) for p in others]
    int4 = [error(live, p, "int4_kv", segments=1)  # bf16 sent, int4 received
            for p in text_prompts(live["model"], [2049, 1025], seed=FP8_SEED + 2)]
    print(f"\nfp8 on the wire, aligned: first-token |dlogprob| {[f'{r[0]:.2e}' for r in rows]}, "
          f"worst {[f'{r[1]:.2e}' for r in rows]}; fp8 at twice its scales "
          f"{[f'{r[1]:.2e}' for r in wrong]}; int4 per tensor (not asserted) "
          f"{[f'{r[1]:.2e}' for r in int4]}; bound {bound:.2e} ({FP8_MARGIN:g} x the "
          f"benchmark's fp8 max)")
    live["errors"]["fp8 wire (aligned)"] = max(r[1] for r in rows)
    assert all(r[0] > 0.0 for r in rows), rows  # fp8 did change the KV (bf16 here: exactly 0)
    assert max(r[1] for r in rows) < bound
    # a wrong-scale quantizer is worse than every genuine fp8 transfer measured here
    assert min(r[1] for r in wrong) > max(r[1] for r in rows), (rows, wrong)


def _cpu_s(procs: list[Any]) -> float:
    """CPU seconds (user + system, all threads) of these processes so far."""
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def test_pinned_instances_stop_spinning_after_a_step(live: dict) -> None:
    """vllm.idle_spin_s auto (launch.py): pdp-0 is pinned (core 0, beside prfaas-0), so its
    EngineCore and Worker spin 10 ms after a step, then sleep; the reference instance (started
    with vLLM's own 1 s spin) is the control and spins after the same request. Both read over
    the same 0.8 s after their answers; 3 tries (a loaded host can starve the spinner)."""
    dep, ref = live["dep"], live["ref"]
    pdp_url = f"http://{dep.topology.worker('pdp-0').host}:{dep.topology.worker('pdp-0').port}"
    trees = {"pdp-0": process_tree(dep.pid("pdp-0")), "ref": process_tree(ref.proc.pid)}
    assert len(trees["pdp-0"]) >= 3  # API server, EngineCore, Worker: the spawned ones count
    seen = []
    for seed in range(3):
        [prompt] = prompts([64], seed=40 + seed)
        for url in (pdp_url, ref.spec.url):
            status, _ = post(url, {"model": "tiny", "prompt": prompt, "max_tokens": 1})
            assert status == 200
        before = {k: _cpu_s(v) for k, v in trees.items()}
        time.sleep(0.8)
        used = {k: _cpu_s(v) - before[k] for k, v in trees.items()}
        seen.append(used)
        if used["ref"] > 0.1 and used["pdp-0"] < used["ref"] / 3:
            break
    print(f"\nCPU-s in the 0.8 s after a step: {seen}")
    assert used["ref"] > 0.1 and used["pdp-0"] < used["ref"] / 3, seen


def test_hybrid_long_prompt_goes_through_the_router_on_prfaas(live: dict) -> None:
    [prompt] = prompts([1500], seed=12)
    reply = routed(live["dep"].url, prompt, 4)
    p = reply["prfaas"]
    assert p["route"] == "prfaas" and not p["retried"], p
    ref_ids, _ = single(live, prompt, 4)
    assert p["token_ids"][0] == ref_ids[0]
    states = [e for e in trace(live["traces"], "pdd-0")
              if e["ev"] == "tensor" and e["name"].startswith("s")]
    assert {e["layer"] for e in states} == {0, 1, 2}  # the three GDN layers' states crossed
    # kv_bytes is the prefill connector's count of what it queued; the decoder's receiver
    # counts what it received, tensor by tensor, on its own (the trace of that transfer)
    tid = states[-1]["tid"]
    received = sum(e["bytes"] for e in trace(live["traces"], "pdd-0")
                   if e["ev"] == "tensor" and e["tid"] == tid)
    print(f"\nkv_bytes {p['kv_bytes']} (router reply) vs {received} received")
    assert p["kv_bytes"] == received > 0
    print(f"\nerrors (max |dlogprob|): {live['errors']}")


def _aligned_only(index: Any, events: list[Any]) -> None:
    """The mapping before hybrid events were placed (negative control): a state group's event
    whose hashes do not line up with its tokens (align mode) refused whole, so the instance
    looks dense and each attention block counts as its own state."""
    from prfaas.cache.block_events import BlockStored

    index.apply_batch([e for e in events if not isinstance(e, BlockStored)
                       or len(e.token_ids) == len(e.block_hashes) * e.block_size_tokens])


TAP_MAPPINGS = {"router": lambda index, events: index.apply_batch(events),
                "aligned_only": _aligned_only}
EVENT_KINDS = ("stored_blocks", "removed_blocks", "unplaced_blocks")


def _settle(url: str, tap: EventTap, start: dict[str, float]) -> None:
    """Until the router has applied every event the tap saw (its counters since `start` equal
    the tap's own index's, the tap quiet for 1 s): readiness, not a sleep."""
    deadline = time.monotonic() + 120
    while True:
        mine = tap.stats("router")
        got = event_counts(url, "pdp-0")
        if tap.quiet(1.0) and all(got.get(k, 0.0) - start.get(k, 0.0) == mine[k]
                                  for k in EVENT_KINDS):
            return
        assert time.monotonic() < deadline, (mine, got, start)
        time.sleep(0.2)


def test_hybrid_prefix_state_follows_vllm_kv_events_including_evictions(live: dict) -> None:
    """The main router (prfaas-threshold, t = 1024) knows pdp-0's cache only from vLLM's KV
    events. On this model vLLM keeps no GDN state on a prompt's first pass (align mode), keeps
    the state at block 7 (1,792 tokens) on the second, and can resume only there. The router's
    count must be vLLM's own `cached_tokens` at each step: 0 after the first pass, 1,792
    after the second (routed to pdp-0 by it: 2000 - 1792 <= t), 0 once fillers evicted A.
    Negative controls: the same live events through the old mapping (a second subscriber,
    EventTap) count 1,792 after the first pass; a router with events off (it infers pdp-0's
    cache from the requests it sent) counts 1,792 where vLLM computes the prompt again, after
    the first pass and after the eviction."""
    dep = live["dep"]
    main, topo = dep.url, dep.topology
    pdp = topo.worker("pdp-0")
    assert topo.vllm is not None
    control = ExtraRouter(dep, live["logs"], "no-events", policy="all-pd", policy_args={},
                          vllm=dataclasses.replace(topo.vllm, kv_events=False))
    tap = EventTap(f"tcp://{pdp.host}:{pdp.events_port}", "pdp-0",
                   topo.vllm.block_size_tokens, TAP_MAPPINGS)
    try:
        time.sleep(1.0)  # PUB/SUB: the tap's subscription reaches vLLM (loopback: ms)
        start = event_counts(main, "pdp-0")
        [a] = prompts([2000], seed=81)  # 7 full blocks of 256: 1,792 tokens
        fillers = prompts([3000] * 6, seed=82)  # >= 6 x 12 new blocks > pdp-0's 64: LRU
        first = routed(control.url, a, 4)["prfaas"]  # computed on pdp-0, not via `main`
        assert first["prefill_node"] == "pdp-0" and first["cached_tokens"] == 0, first
        _settle(main, tap, start)
        counts = {name: [tap.counted(name, a)] for name in TAP_MAPPINGS}

        # 1. after the first pass vLLM holds A's blocks but no state: nothing to resume
        not_yet = routed(main, a, 4)["prfaas"]
        assert "pdp-0" not in not_yet["router_cached_tokens"], not_yet
        assert not_yet["route"] == "prfaas", not_yet  # 2000 > t
        second = routed(control.url, a, 4)["prfaas"]  # the inference's count vs vLLM's
        assert second["router_cached_tokens"].get("pdp-0") == 1792, second
        assert second["prefill_node"] == "pdp-0" and second["cached_tokens"] == 0, second
        _settle(main, tap, start)
        for name in TAP_MAPPINGS:
            counts[name].append(tap.counted(name, a))

        # 2. after the second pass: routed by its cached tokens as vLLM's events report them
        hit = routed(main, a, 4)["prfaas"]
        assert hit["route"] == "pd" and hit["prefill_node"] == "pdp-0", hit
        assert hit["router_cached_tokens"].get("pdp-0") == hit["cached_tokens"] == 1792, hit

        # 3. fillers on pdp-0 evict A (vLLM's BlockRemoved): the router stops counting it
        for prompt in fillers:
            assert routed(control.url, prompt, 4)["prfaas"]["prefill_node"] == "pdp-0"
        _settle(main, tap, start)
        for name in TAP_MAPPINGS:
            counts[name].append(tap.counted(name, a))
        after = event_counts(main, "pdp-0")
        assert after.get("resets", 0.0) == start.get("resets", 0.0), after  # not a reset
        assert after.get("removed_blocks", 0.0) > start.get("removed_blocks", 0.0), after
        miss = routed(main, a, 4)["prfaas"]
        assert "pdp-0" not in miss["router_cached_tokens"], miss
        assert miss["route"] == "prfaas", miss
        stale = routed(control.url, a, 4)["prfaas"]  # vLLM's word: A is gone from pdp-0
        assert stale["prefill_node"] == "pdp-0" and stale["cached_tokens"] == 0, stale
        assert stale["router_cached_tokens"].get("pdp-0") == 1792, stale  # over-counted

        vllm_said = [second["cached_tokens"], hit["cached_tokens"], stale["cached_tokens"]]
        print(f"\nA on pdp-0 after pass 1 / pass 2 / the fillers: vLLM cached {vllm_said}; "
              f"tap counts {counts}; router replies {not_yet['router_cached_tokens']} -> "
              f"{not_yet['route']}, {hit['router_cached_tokens']} -> {hit['route']}, "
              f"{miss['router_cached_tokens']} -> {miss['route']}; pdp-0 events {after} "
              f"(start {start}); events-off router counted 1792 twice")
        assert counts["router"] == vllm_said, counts  # the tap agrees with the router
        assert counts["aligned_only"][0] == 1792 != vllm_said[0], counts
    finally:
        tap.close()
        control.stop()
