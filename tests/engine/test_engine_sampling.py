"""Sampling parameters (vLLM semantics), logprobs, stop tokens and prompt logits."""

from __future__ import annotations

import pytest
import torch
from engine_factories import engine, prompt

from prfaas.core.errors import ConfigError
from prfaas.engine import SamplingParams
from prfaas.engine.penalties import TokenHistory, apply_penalties
from prfaas.engine.sampling import choose, prompt_logprobs, sample_full, token_logprobs


def test_penalties_follow_vllm() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.5])
    history = TokenHistory([0, 1], vocab_size=5)  # prompt saw tokens 0 and 1
    for t in (2, 2, 3):  # output so far: token 2 twice, token 3 once
        history.add(t)
    rep = apply_penalties(logits, history, SamplingParams(repetition_penalty=2.0))
    assert rep.tolist() == [1.0, -4.0, 0.5, -2.0, 0.5]  # prompt and output tokens, sign-aware
    freq = apply_penalties(logits, history, SamplingParams(frequency_penalty=0.5))
    assert freq.tolist() == [2.0, -2.0, 0.0, -1.5, 0.5]  # output counts only
    pres = apply_penalties(logits, history, SamplingParams(presence_penalty=0.25))
    assert pres.tolist() == [2.0, -2.0, 0.75, -1.25, 0.5]
    assert logits.tolist() == [2.0, -2.0, 1.0, -1.0, 0.5]  # not modified in place


def test_top_k_min_p_restrict_the_draws() -> None:
    logits = torch.randn(258, generator=torch.Generator().manual_seed(1))
    top5 = set(torch.topk(logits, 5).indices.tolist())
    hot = dict(temperature=2.0, seed=7)
    k5 = {choose(logits, SamplingParams(top_k=5, **hot), s, None, ()) for s in range(200)}
    assert k5 <= top5 and len(k5) > 1
    free = {choose(logits, SamplingParams(**hot), s, None, ()) for s in range(200)}
    assert not free <= top5
    assert {choose(logits, SamplingParams(top_k=1, **hot), s, None, ())
            for s in range(20)} == {int(logits.argmax())}
    probs = torch.softmax(logits.double() / 2.0, -1)
    allowed = set((probs >= 0.5 * probs.max()).nonzero().flatten().tolist())
    mp = {choose(logits, SamplingParams(min_p=0.5, **hot), s, None, ()) for s in range(200)}
    assert mp <= allowed and len(allowed) > 1


@pytest.mark.parametrize(("field", "value"), [
    ("top_k", 0), ("top_k", -2), ("min_p", 1.5), ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0), ("repetition_penalty", 0.0), ("min_tokens", -1),
    ("logprobs", 21), ("temperature", float("inf")),
])
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_logprobs_are_the_raw_log_softmax() -> None:
    logits = torch.randn(258, generator=torch.Generator().manual_seed(2))
    ref = torch.log_softmax(logits, -1)
    got = sample_full(logits, SamplingParams(temperature=1.0, frequency_penalty=1.0,
                                             logprobs=3), 0, None, 257)
    assert got.logprob == float(ref[got.token])
    order = torch.argsort(ref, descending=True)[:3].tolist()
    assert [t for t, _ in got.top] == order and got.top[0][1] == float(ref.max())
    assert token_logprobs(logits, 5, 0).top == ()


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.zeros(258)
    logits[257] = 10.0
    logits[65] = 9.0
    params = SamplingParams(min_tokens=2, stop_token_ids=(10,))
    assert [sample_full(logits, params, s, None, 257).token for s in range(3)] == [65, 65, 257]
    logits[10] = 11.0
    assert sample_full(logits, params, 0, None, 257).token == 65


def test_penalties_change_generate_deterministically() -> None:
    eng = engine("kimi")
    ids = prompt(40)
    plain = eng.generate(ids, 30, SamplingParams(ignore_eos=True))
    assert len(set(plain)) < 30  # greedy repeats a token: that is where the penalty bites
    pen = SamplingParams(ignore_eos=True, frequency_penalty=2.0)
    a, b = eng.generate(ids, 30, pen), eng.generate(ids, 30, pen)
    assert a == b and a != plain
    first = next(i for i, t in enumerate(plain) if t in plain[:i])
    assert a[:first] == plain[:first]  # identical until the first repeat


def test_penalized_sampling_is_batch_invariant() -> None:
    eng = engine("kimi")
    params = [SamplingParams(temperature=1.0, seed=3, presence_penalty=1.0, top_k=20,
                             ignore_eos=True),
              SamplingParams(repetition_penalty=1.5, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.1, seed=9, ignore_eos=True)]
    prompts = [prompt(30 + 10 * i, seed=i) for i in range(3)]
    alone = [eng.generate(p, 8, sp) for p, sp in zip(prompts, params, strict=True)]
    seqs = []
    for p, sp in zip(prompts, params, strict=True):
        r = eng.prefill(p)
        seqs.append(eng.start(r.kv, r.logits, sp, p))
    outs: list[list[int]] = [[s.last_token] for s in seqs]
    for _ in range(7):
        for out, token in zip(outs, eng.decode_step(seqs), strict=True):
            out.append(token)
    assert outs == alone


def test_generate_stops_at_stop_token_ids() -> None:
    eng = engine("kimi")
    ids = prompt(30)
    free = eng.generate(ids, 10, SamplingParams(ignore_eos=True))
    at = max(i for i, t in enumerate(free) if t not in free[:i])
    stopped = eng.generate(ids, 10, SamplingParams(ignore_eos=True, stop_token_ids=(free[at],)))
    assert stopped == free[:at]
    held = eng.generate(ids, 10, SamplingParams(ignore_eos=True, stop_token_ids=(free[at],),
                                                min_tokens=at + 1))
    assert held[:at] == free[:at] and free[at] not in held[:at + 1]


def test_prompt_logits_match_from_scratch_and_resumed() -> None:
    eng = engine("kimi")
    ids = prompt(150)
    full = eng.prefill(ids, all_logits=True)
    assert full.prompt_logits is not None and full.prompt_logits.shape == (150, 258)
    assert torch.equal(full.prompt_logits[-1], full.logits)
    resumed = eng.prefill(ids, prefix=full.kv.snapshot_at(128), all_logits=True)
    assert resumed.prompt_logits is not None
    assert torch.equal(resumed.prompt_logits, full.prompt_logits[128:])


def test_prompt_logprobs_are_log_softmax_of_the_previous_position() -> None:
    eng = engine("kimi")
    ids = prompt(70)
    logits = eng.prefill(ids, all_logits=True).prompt_logits
    assert logits is not None
    got = prompt_logprobs(ids, logits, 2)
    ref = torch.log_softmax(logits, -1)
    assert len(got) == 69
    for i, s in enumerate(got):
        assert s.token == ids[i + 1] and s.logprob == float(ref[i, ids[i + 1]])
        assert [t for t, _ in s.top] == torch.argsort(ref[i], descending=True)[:2].tolist()


def test_start_with_output_offset_continues_the_sampling_state() -> None:
    eng = engine("kimi")
    ids = prompt(40)
    params = SamplingParams(temperature=1.0, seed=4, frequency_penalty=1.5, ignore_eos=True)
    r = eng.prefill(ids)
    seq = eng.start(r.kv, r.logits, params, ids)
    for _ in range(3):
        eng.decode_step([seq])
    assert seq.history is not None and seq.step == 4
    # a resumed attempt: prompt + the 3 outputs so far, then output step 3 from these logits
    resumed = eng.start(r.kv, r.logits, params, [*ids, 5, 6, 7], output_offset=3)
    assert resumed.step == 4 and resumed.history is not None
    assert resumed.history.num_output == 4
    assert torch.equal(resumed.history.prompt_mask, TokenHistory(ids, 258).prompt_mask)
    assert resumed.last_token == choose(r.logits, params, 3, _history(ids, [5, 6, 7]), ())
    with pytest.raises(ConfigError, match="output_offset"):
        eng.start(r.kv, r.logits, params, ids, output_offset=40)


def _history(prompt_ids: list[int], outputs: list[int]) -> TokenHistory:
    h = TokenHistory(prompt_ids, 258)
    for t in outputs:
        h.add(t)
    return h
