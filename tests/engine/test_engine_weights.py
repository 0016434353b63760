"""The shipped trained weights (engine/weights.py): their packing, and that they learned.

Packing: int8 codes per row with a float32 scale, read back within half a step of each value;
vectors exact. Learning: on held-out stdlib docstrings (text the model never trained on), the
trained `tiny` preset predicts the next byte far better than its own seeded random init (the
control), and its distributions are peaked.
"""

from __future__ import annotations

import numpy as np
import torch
from engine_factories import engine

from prfaas.bench.stdlib_text import heldout_windows
from prfaas.engine import Engine, EngineConfig
from prfaas.engine import weights as packed


def test_pack_reads_back_within_half_a_step_per_row() -> None:
    rng = np.random.default_rng(0)
    x = {"w": (rng.standard_normal((6, 5, 9)) * rng.uniform(0.01, 10, (6, 5, 1))).astype(
        np.float32), "norm": rng.standard_normal(7).astype(np.float32),
         "zeros": np.zeros((3, 4), np.float32)}
    stored = packed.pack(x)
    assert stored["w"].dtype == np.int8 and stored["w.scale"].shape == (6, 5)
    back = packed.unpack(stored)
    step = np.abs(x["w"]).max(axis=-1, keepdims=True) / 127
    assert np.all(np.abs(back["w"] - x["w"]) <= step / 2 * (1 + 1e-6))
    assert not np.array_equal(back["w"], x["w"])  # it was quantized
    assert np.array_equal(back["norm"], x["norm"]) and not back["zeros"].any()


def _nll(eng: Engine, ids: list[int]) -> tuple[float, float]:
    """Mean next-byte loss (nats) and mean top-1 probability over a prompt."""
    res = eng.prefill(ids, all_logits=True)
    assert res.prompt_logits is not None
    logp = torch.log_softmax(res.prompt_logits[:-1].double(), dim=-1)
    target = torch.tensor(ids[1:])
    nll = -logp[torch.arange(len(target)), target].mean()
    return float(nll), float(logp.exp().max(-1).values.mean())


def test_the_trained_preset_has_learned_and_its_seeded_init_has_not() -> None:
    trained, seeded = engine("kimi"), Engine(EngineConfig.tiny(weights="seed"))
    [ids] = heldout_windows(lambda t: trained.tokenizer.encode(t, add_bos=False), [511], 3)
    ids = [trained.tokenizer.bos_id, *ids]
    loss, top1 = _nll(trained, ids)
    loss0, top0 = _nll(seeded, ids)
    print(f"\nheld-out loss: trained {loss:.3f} nats/byte (top-1 p {top1:.2f}), seeded init "
          f"{loss0:.3f} (top-1 p {top0:.2f})")
    assert loss < 2.5 < 5.0 < loss0  # ln 256 = 5.5 is a uniform byte
    assert top1 > 0.35 > 0.1 > top0
