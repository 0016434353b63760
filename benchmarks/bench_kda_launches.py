"""Kernel launches of a prefill, counted on the CPU: how many device operations one layer of the
Kimi-Linear-like preset runs per 64 tokens, under the CPU engine's settings and the GPU's.

A GPU runs one kernel per tensor operation the model issues (eager PyTorch), and each costs the
host several microseconds to launch whatever its size, so a prefill that issues tens of small
operations per 64 tokens is bound by launching them, not by the GPU. The count does not depend
on the layer's widths, so it is taken here on the CPU with torch.profiler, on a narrow copy of
the preset (same 27-layer pattern, same chunking): every leaf `aten::` operation that is not a
pure view (view, slice, transpose, ... launch nothing) is counted as one launch. Three ways of
running a layer over T tokens:
- `cpu_default`: 64-token prefill chunks (the block size), the CPU engine's setting;
- `big_chunk_loop`: 8192-token prefill chunks but the KDA recurrence still one direct step per
  64-token sub-chunk (kda.kda_chunk_loop): what a larger chunk alone buys;
- `gpu_preset`: 8192-token chunks and the batched KDA form (kda.kda_chunk): the preset's.

    .venv/bin/python benchmarks/bench_kda_launches.py [--quick]
        -> benchmarks/results/kda_launches.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from prfaas.engine import Engine, EngineConfig, kda_layer
from prfaas.engine import kda as kda_module

OUT = Path(__file__).parent / "results" / "kda_launches.json"
SUB_CHUNK = 64
# aten operations that only make a new view of existing memory (no kernel on a GPU)
VIEWS = {"aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided",
         "aten::transpose", "aten::t", "aten::permute", "aten::slice", "aten::select",
         "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::alias", "aten::detach",
         "aten::unbind", "aten::split", "aten::chunk", "aten::narrow", "aten::lift_fresh",
         "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_strided",
         "aten::_unsafe_view", "aten::diagonal", "aten::numpy_T", "aten::result_type",
         "aten::is_nonzero", "aten::resize_", "aten::detach_", "aten::set_",
         # leaves only when they do nothing (a real conversion or copy has a child op)
         "aten::to", "aten::contiguous"}


def narrow_preset() -> EngineConfig:
    """The Kimi-Linear-like preset's pattern and chunking on tiny widths (counts only)."""
    return EngineConfig.kimi_linear(hidden=64, num_heads=2, head_dim=16, kv_lora_rank=32,
                                    rope_head_dim=8, mlp_hidden=128, gate_rank=8,
                                    vocab_size=258, max_context_tokens=32768)


def launches(fn: Callable[[], object]) -> tuple[int, Counter[str]]:
    """Leaf non-view aten operations `fn` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names: Counter[str] = Counter()
    for event in prof.events():
        if not event.name.startswith("aten::") or event.name in VIEWS:
            continue
        if any(child.name.startswith("aten::") for child in event.cpu_children):
            continue
        names[event.name] += 1
    return sum(names.values()), names


@contextmanager
def loop_kda() -> Iterator[None]:
    """The KDA layer's recurrence as one direct step per sub-chunk (the pre-batching form)."""
    kda_layer.kda_chunk = kda_module.kda_chunk_loop  # type: ignore[assignment]
    try:
        yield
    finally:
        kda_layer.kda_chunk = kda_module.kda_chunk  # type: ignore[assignment]


def layer_counts(engine: Engine, index: int, tokens: int) -> tuple[int, Counter[str]]:
    """Launches of layer `index` over `tokens` new tokens from an empty cache."""
    cfg = engine.config
    block = engine.model.block(index)
    store = engine.model.mixer(index).new_store()
    x = torch.randn(tokens, cfg.hidden, generator=torch.Generator().manual_seed(index))
    with torch.inference_mode():
        block.prefill(x, 0, store, cfg.chunk_tokens, tokens)  # warm-up (allocator)
        store = engine.model.mixer(index).new_store()
        return launches(lambda: block.prefill(x, 0, store, cfg.chunk_tokens, tokens))


def measure(tokens: int) -> dict[str, Any]:
    preset = narrow_preset()
    ways: dict[str, tuple[EngineConfig, bool]] = {
        "cpu_default": (dataclasses.replace(preset, prefill_chunk_tokens=0), False),
        "big_chunk_loop": (preset, True),
        "gpu_preset": (preset, False),
    }
    kda_i, mla_i = preset.layer_pattern.index("K"), preset.layer_pattern.index("M")
    n_kda, n_mla = preset.layer_pattern.count("K"), preset.layer_pattern.count("M")
    chunks = tokens // SUB_CHUNK
    out: dict[str, Any] = {}
    for way, (cfg, loop) in ways.items():
        engine = Engine(cfg)
        with loop_kda() if loop else _nothing():
            kda_n, kda_ops = layer_counts(engine, kda_i, tokens)
            mla_n, _ = layer_counts(engine, mla_i, tokens)
        per_prefill = n_kda * kda_n + n_mla * mla_n
        out[way] = {
            "prefill_chunk_tokens": cfg.chunk_tokens,
            "kda_form": "direct step per 64-token sub-chunk" if loop or cfg.chunk_tokens == 64
            else "batched (one baddbmm per sub-chunk)",
            "kda_layer_launches": kda_n, "mla_layer_launches": mla_n,
            "kda_launches_per_layer_per_64_tokens": round(kda_n / chunks, 2),
            "mla_launches_per_layer_per_64_tokens": round(mla_n / chunks, 2),
            "layers_launches_per_prefill": per_prefill,
            "kda_top_ops": dict(kda_ops.most_common(8)),
        }
        print(f"{way:>15}: KDA layer {kda_n / chunks:6.2f} launches / 64 tokens, MLA layer "
              f"{mla_n / chunks:6.2f}; {n_kda} KDA + {n_mla} MLA layers: {per_prefill} "
              f"launches for {tokens} tokens")
    return out


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8192 tokens only")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = (8192,) if args.quick else (8192, 32768)
    doc = {
        "benchmark": "kda_launches", "backend": "native (counted on the CPU, for a GPU)",
        "date": dt.date.today().isoformat(), "torch": torch.__version__,
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "preset": "kimi_linear (narrow copy: counts do not depend on widths)",
        "pattern": narrow_preset().layer_pattern,
        "runs": [{"tokens": n, **measure(n)} for n in sizes],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
