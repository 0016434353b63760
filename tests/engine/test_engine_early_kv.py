"""Early KV emission: a full-attention layer's KV reaches the prefill hook right after its KV
projections, before that layer's attention runs; linear layers emit when they are done. What
the hook got is bitwise the final cache."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_factories import PATTERNS, prompt

from prfaas.engine import Engine, LayerKV
from prfaas.engine.kda_layer import KDA

Event = tuple[str, int]


def _logged_engine(name: str, log: list[Event]) -> Engine:
    """A fresh engine whose mixers log each attention / linear chunk they compute."""
    eng = Engine(PATTERNS[name])
    for i in range(eng.config.num_layers):
        mixer = eng.model.mixer(i)
        method = "prefill_chunk" if isinstance(mixer, KDA) else "attend_chunk"
        inner = getattr(mixer, method)

        def logged(*args: Any, _inner: Any = inner, _i: int = i, _m: str = method) -> Any:
            out = _inner(*args)
            log.append((_m, _i))  # logged once the chunk's output exists
            return out

        object.__setattr__(mixer, method, logged)
    return eng


def _equal(a: LayerKV, b: LayerKV) -> bool:
    return ((a.layer_index, a.kind, a.start_token, a.end_token)
            == (b.layer_index, b.kind, b.start_token, b.end_token)
            and a.tensors.keys() == b.tensors.keys()
            and all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors))


@pytest.mark.parametrize("name", ["kimi", "mixed"])
def test_attention_kv_is_emitted_before_the_layers_attention(name: str) -> None:
    log: list[Event] = []
    eng = _logged_engine(name, log)
    ids = prompt(300, seed=5)  # 5 chunks of 64 tokens, the last one partial
    eng.prefill(ids, on_layer=lambda kv: log.append(("hook", kv.layer_index)))
    hooks = [i for ev, i in log if ev == "hook"]
    assert hooks == list(range(eng.config.num_layers))
    for i in range(eng.config.num_layers):
        hook_at = log.index(("hook", i))
        chunks_at = [k for k, ev in enumerate(log) if ev[1] == i and ev[0] != "hook"]
        assert len(chunks_at) == 5
        if eng.config.kind_of(i) == "linear":  # the state is final only after the last chunk
            assert hook_at > max(chunks_at)
        else:  # no attention output of this layer exists yet when its KV is handed out
            assert hook_at < min(chunks_at)
    last = eng.config.num_layers - 1
    if name == "kimi":  # the default model's last layer is MLA and holds the most bytes
        assert eng.config.kind_of(last) == "mla"
        assert log.index(("hook", last)) < log.index(("attend_chunk", last))


@pytest.mark.parametrize("name", ["kimi", "mixed"])
@pytest.mark.parametrize("cached", [0, 128])
def test_emitted_kv_is_bitwise_the_final_kv(name: str, cached: int) -> None:
    eng = Engine(PATTERNS[name])
    ids = prompt(300, seed=6)
    prefix = eng.prefill(ids).kv.snapshot_at(cached) if cached else None
    got: list[LayerKV] = []
    result = eng.prefill(ids, prefix=prefix, on_layer=got.append)
    final = result.kv.export(cached, len(ids))
    assert len(got) == len(final) == eng.config.num_layers
    assert all(_equal(a, b) for a, b in zip(got, final, strict=True))
    assert all(kv.byte_size() > 0 for kv in got)
