"""Bitwise exactness: resumed prefill == from-scratch prefill; batched decode == batch-1 decode;
KV shipped through the wire helpers and imported decodes the same tokens as `generate`."""

from __future__ import annotations

import pytest
import torch
from engine_factories import engine, prompt

from prfaas.engine import (
    DecodeSeq,
    Engine,
    EngineConfig,
    LayerKV,
    SamplingParams,
    layer_kv_from_arrays,
    layer_kv_to_arrays,
)
from prfaas.engine.plain import PlainDecoder


def _kv_equal(a: list[LayerKV], b: list[LayerKV]) -> bool:
    return all(x.kind == y.kind and x.start_token == y.start_token
               and x.tensors.keys() == y.tensors.keys()
               and all(torch.equal(x.tensors[n], y.tensors[n]) for n in x.tensors)
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", ["kimi", "mimo", "mixed"])
def test_resumed_prefill_is_bitwise_equal(name: str) -> None:
    eng = engine(name)
    ids = prompt(300, seed=1)
    scratch = eng.prefill(ids)
    for cached in (64, 128, 256):
        resumed = eng.prefill(ids, prefix=scratch.kv.snapshot_at(cached))
        assert resumed.num_computed_tokens == 300 - cached
        assert torch.equal(resumed.logits, scratch.logits)
        assert _kv_equal(resumed.kv.export(0, 300), scratch.kv.export(0, 300))


def test_resume_8k_prompt_is_bitwise_equal() -> None:
    eng = engine("kimi")
    ids = prompt(8192 - 37, seed=2)
    scratch = eng.prefill(ids)
    resumed = eng.prefill(ids, prefix=scratch.kv.snapshot_at(7936))
    assert torch.equal(resumed.logits, scratch.logits)
    assert _kv_equal(resumed.kv.export(7936, len(ids)), scratch.kv.export(7936, len(ids)))


@pytest.mark.parametrize("name", ["kimi", "mixed"])
def test_engine_matches_plain_forward(name: str) -> None:
    """Chunked/paged prefill against the plain whole-sequence forward: same math, different
    association order, so close (1e-4 on logits of magnitude ~3) but not bitwise."""
    eng = engine(name)
    ids = prompt(200, seed=3)
    torch.testing.assert_close(eng.prefill(ids).logits,
                               eng.model.forward_full(torch.tensor(ids)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["kimi", "mimo", "mixed"])
def test_batched_decode_equals_batch_one(name: str) -> None:
    eng = engine(name)
    prompts = [prompt(n, seed=n) for n in (3, 64, 65, 130, 7, 200, 90, 11, 150)]
    alone = []
    for ids in prompts:
        r = eng.prefill(ids)
        seq = DecodeSeq(r.kv, r.first_token)
        alone.append([eng.decode_step([seq])[0] for _ in range(6)])
    seqs = []
    for ids in prompts:
        r = eng.prefill(ids)
        seqs.append(DecodeSeq(r.kv, r.first_token))
    steps = [eng.decode_step(seqs) for _ in range(6)]
    assert [list(col) for col in zip(*steps, strict=True)] == alone
    assert len({tuple(a) for a in alone}) > 1  # different prompts, different continuations


@pytest.mark.parametrize("name", ["kimi", "mimo", "mixed"])
def test_remote_prefill_from_cached_prefix_reproduces_generate(name: str) -> None:
    eng = engine(name)
    ids = prompt(230, seed=4)
    reference = eng.generate(ids, 12, SamplingParams(ignore_eos=True))
    # "decode node" holds the first 128 tokens; "prefill node" computes the rest and streams
    local_prefix = eng.prefill(ids[:129]).kv.snapshot_at(128)
    remote_prefix = eng.prefill(ids[:150]).kv.snapshot_at(128)
    shipped = []
    remote = eng.prefill(ids, prefix=remote_prefix, on_layer=lambda kv: shipped.append(
        layer_kv_from_arrays(kv.layer_index, kv.kind, kv.start_token, kv.end_token,
                             [(n, a.copy()) for n, a in layer_kv_to_arrays(kv)])))
    kv = eng.import_kv(shipped, prefix=local_prefix, token_ids=ids)
    seq = DecodeSeq(kv, remote.first_token)
    other = DecodeSeq(eng.prefill(prompt(77, seed=9)).kv, 65)  # batched with another request
    out = [remote.first_token]
    while len(out) < 12:
        out.append(eng.decode_step([other, seq])[1])
    assert out == reference


@pytest.mark.parametrize("name", ["kimi", "mimo", "mixed"])
def test_plain_decoder_matches_engine_decode(name: str) -> None:
    """The benchmark's no-bookkeeping baseline computes the same model (close, not bitwise)."""
    eng = engine(name)
    base = eng.prefill(prompt(130, seed=6))
    seqs = [DecodeSeq(base.kv.snapshot_at(130), base.first_token) for _ in range(3)]
    plain = PlainDecoder(eng.model, [s.kv for s in seqs], 4)
    for _ in range(3):
        expected = plain.step(torch.tensor([s.last_token for s in seqs]))
        with torch.inference_mode():
            ids = torch.tensor([s.last_token for s in seqs])
            got = eng.model.decode(ids, [[s.kv.stores[i] for s in seqs]
                                         for i in range(eng.config.num_layers)])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
        for s, row in zip(seqs, got, strict=True):
            s.last_token = int(row.argmax())


def test_two_threads_keep_resume_bitwise_and_greedy_batch_agreement() -> None:
    """With 2 intra-op threads MKL splits GEMM rows by batch size, so batched decode rows may
    differ from batch-1 rows at ~1e-6 (observed); resume stays bitwise (same shapes) and the
    greedy tokens agree on these prompts."""
    try:
        eng = Engine(EngineConfig.tiny(threads=2))
        assert torch.get_num_threads() == 2
        ids = prompt(300, seed=12)
        scratch = eng.prefill(ids)
        assert torch.equal(eng.prefill(ids, prefix=scratch.kv.snapshot_at(128)).logits,
                           scratch.logits)
        prompts = [prompt(n, seed=n) for n in (5, 70, 130, 9, 64, 33, 150, 80)]
        alone = []
        for p in prompts:
            r = eng.prefill(p)
            seq = DecodeSeq(r.kv, r.first_token)
            alone.append([eng.decode_step([seq])[0] for _ in range(8)])
        seqs = [DecodeSeq(r.kv, r.first_token) for r in map(eng.prefill, prompts)]
        steps = [eng.decode_step(seqs) for _ in range(8)]
        assert [list(col) for col in zip(*steps, strict=True)] == alone
    finally:
        torch.set_num_threads(1)  # the cached engines of the other tests run on one thread


def test_requests_join_and_leave_the_batch_without_changing_tokens() -> None:
    """Continuous batching: B joins after A's 3rd step, A leaves after its 6th; each request's
    tokens equal its solo `generate`."""
    eng = engine("kimi")
    ids_a, ids_b = prompt(90, seed=20), prompt(150, seed=21)
    solo = SamplingParams(ignore_eos=True)
    want_a, want_b = eng.generate(ids_a, 7, solo), eng.generate(ids_b, 8, solo)
    ra, rb = eng.prefill(ids_a), eng.prefill(ids_b)
    a, b = DecodeSeq(ra.kv, ra.first_token), DecodeSeq(rb.kv, rb.first_token)
    got_a, got_b = [ra.first_token], [rb.first_token]
    for step in range(13):
        batch = ([a] if step < 6 else []) + ([b] if step >= 3 and len(got_b) < 8 else [])
        for seq, token in zip(batch, eng.decode_step(batch), strict=True):
            (got_a if seq is a else got_b).append(token)
    assert (got_a, got_b) == (want_a, want_b)
