"""The engine's GPU settings, checked on the CPU: the batched KDA form, fused attention, large
prefill chunks, a bf16 engine built weight by weight, the Kimi-Linear-like preset's geometry,
and the one-line errors for a device this machine lacks (it has no CUDA).

Tolerances: fp32 forms that associate sums differently agree to a few ulps of values ~0.1-3
(the KDA forms: 2e-5 absolute, as test_engine_kda.py; logits through 27 layers: 1e-4, as
test_engine_exactness.py's plain-forward check); each has a negative control that moves the
result by far more than its tolerance. bf16 is compared by what it must keep, not by bits.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_engine_kda import _inputs  # the KDA tests' random inputs

from prfaas.core.errors import ConfigError
from prfaas.engine import Engine, EngineConfig, layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.engine.kda import kda_chunk, kda_chunk_loop, kda_recurrent
from prfaas.engine.kv import AttnStore, LayerKV
from prfaas.engine.ops import causal_attention, fused_causal_attention
from prfaas.models.catalog import find_model
from prfaas.serve.worker.manifest import model_identity

# the Kimi-Linear-like preset's pattern and chunking on narrow widths (runs in a second here)
NARROW = dict(hidden=64, num_heads=2, head_dim=16, kv_lora_rank=32, rope_head_dim=8,
              mlp_hidden=128, gate_rank=8, vocab_size=300, max_context_tokens=4096,
              snapshot_every_blocks=4)


def _prompt(n: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [256, *torch.randint(0, 256, (n - 1,), generator=gen).tolist()]


@pytest.mark.parametrize(("t", "chunk", "gate_scale"), [
    (128, 64, 0.5), (150, 64, 0.1), (1000, 64, 0.3), (130, 64, 5.0), (150, 16, 2.0)])
def test_batched_kda_matches_the_recurrence_and_the_chunk_loop(t: int, chunk: int,
                                                               gate_scale: float) -> None:
    """Several sub-chunks at once (padded to whole chunks when T is not a multiple): the
    token-by-token recurrence and the one-step-per-chunk loop are both baselines."""
    q, k, v, g, beta, s0 = _inputs(t, t + chunk, gate_scale)
    o, s = kda_chunk(q, k, v, g, beta, s0, chunk)
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, s0)
    o_loop, s_loop = kda_chunk_loop(q, k, v, g, beta, s0, chunk)
    for got, want in ((o, o_rec), (s, s_rec), (o, o_loop), (s, s_loop)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    # negative control: a 5% error in the start state (what an off-by-one chunk state or a
    # dropped delta-rule term looks like) is far outside that tolerance, even where the
    # gates forget fastest
    o_bad, _ = kda_chunk(q, k, v, g, beta, s0 * 1.05, chunk)
    assert (o_bad - o_rec).abs().max() > 20 * 2e-5


def test_fused_attention_is_the_explicit_causal_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(4, 48, 24, generator=gen)
    k, v = torch.randn(4, 200, 24, generator=gen), torch.randn(4, 200, 16, generator=gen)
    want = causal_attention(q, k, v, 200 - 48, 0)
    torch.testing.assert_close(fused_causal_attention(q, k, v), want, atol=1e-5, rtol=0)
    # negative control: PyTorch's plain is_causal aligns queries with the FIRST keys
    upper_left = torch.nn.functional.scaled_dot_product_attention(
        q, k, torch.nn.functional.pad(v, (0, 8)), is_causal=True)[..., :16]
    assert (upper_left - want).abs().max() > 0.1


def _engine(**overrides: object) -> Engine:
    return Engine(EngineConfig.kimi_linear(**{**NARROW, **overrides}))  # type: ignore[arg-type]


def _fuse(engine: Engine) -> Engine:
    for block in engine.model.blocks:
        if hasattr(block.mixer, "fused_attention"):
            block.mixer.fused_attention = True
    return engine


def test_gpu_prefill_settings_agree_with_the_cpu_engine() -> None:
    """512-token prefill chunks, the batched KDA form and the fused attention kernels (what
    a GPU runs, here in fp32) against the CPU engine's 64-token direct prefill."""
    ids = _prompt(1000, seed=3)
    base = _engine(prefill_chunk_tokens=0).prefill(ids)
    gpu = _fuse(_engine(prefill_chunk_tokens=512)).prefill(ids)
    torch.testing.assert_close(gpu.logits, base.logits, atol=1e-4, rtol=0)
    for a, b in zip(gpu.kv.export(0, 1000), base.kv.export(0, 1000), strict=True):
        for name in a.tensors:
            torch.testing.assert_close(a.tensors[name], b.tensors[name], atol=1e-4, rtol=0)
    # negative control: another prompt's logits are nowhere near
    other = _engine(prefill_chunk_tokens=0).prefill(_prompt(1000, seed=4))
    assert (other.logits - base.logits).abs().max() > 0.1


def test_large_chunks_snapshot_at_chunk_ends_and_resume_from_them() -> None:
    eng = _engine(prefill_chunk_tokens=256)  # snapshots every 4 blocks = every chunk end
    ids = _prompt(700, seed=5)
    scratch = eng.prefill(ids)
    kda = scratch.kv.stores[0]
    assert sorted(kda.snapshots) == [256, 512]  # type: ignore[union-attr]
    resumed = eng.prefill(ids, prefix=scratch.kv.snapshot_at(512))
    torch.testing.assert_close(resumed.logits, scratch.logits, atol=1e-4, rtol=0)
    with pytest.raises(ConfigError, match="snapshot"):  # no state inside a chunk
        scratch.kv.snapshot_at(320)


def test_whole_blocks_append_as_one_copy_and_read_back_the_same() -> None:
    rows = {"latent": torch.randn(300, 8), "k_rope": torch.randn(300, 4)}
    bulk, single = AttnStore("mla", 64), AttnStore("mla", 64)
    bulk.append(rows)
    for lo in range(0, 300, 64):
        single.append({n: t[lo:lo + 64] for n, t in rows.items()})
    assert len(bulk.blocks) == len(single.blocks) == 5
    assert bulk.blocks[0]["latent"].untyped_storage().data_ptr() == \
        bulk.blocks[3]["latent"].untyped_storage().data_ptr()  # one copy for 4 whole blocks
    for lo, hi in ((0, 300), (10, 250), (64, 65)):
        for name, t in bulk.gather(lo, hi).items():
            assert torch.equal(t, rows[name][lo:hi])
            assert torch.equal(t, single.gather(lo, hi)[name])
    bulk.append({n: t[:3] for n, t in rows.items()})  # the tail block is still written
    assert torch.equal(bulk.gather(298, 303)["latent"],
                       torch.cat((rows["latent"][298:], rows["latent"][:3])))
    assert not torch.equal(bulk.gather(0, 64)["latent"], rows["latent"][1:65])  # control


def test_a_bf16_engine_is_built_placed_and_keeps_its_model_identity() -> None:
    """dtype bf16 on the CPU takes the GPU engine's path: weights made in fp32 from the seed
    and moved one at a time, a digest of the fp32 weights on the way."""
    ids = _prompt(300, seed=6)
    fp32 = _engine()
    bf16 = _engine(dtype="bf16")
    assert bf16.model.embed.dtype == torch.bfloat16
    result = bf16.prefill(ids)
    kda, mla = result.kv.stores[0], result.kv.stores[3]
    assert kda.state["state"].dtype == torch.float32  # type: ignore[union-attr]
    assert kda.state["conv"].dtype == torch.bfloat16  # type: ignore[union-attr]
    assert mla.blocks[0]["latent"].dtype == torch.bfloat16  # type: ignore[union-attr]
    assert result.logits.dtype == torch.float32 and torch.isfinite(result.logits).all()
    # the same model: one identity whatever the precision; another seed is another model
    assert bf16.weights_sha256 == fp32.weights_sha256
    assert model_identity(bf16) == model_identity(fp32)
    assert model_identity(_engine(dtype="bf16", seed=1)) != model_identity(fp32)
    # bf16 keeps the fp32 model's prediction: its logits far closer to the fp32 engine's than
    # a different prompt's are (bf16 is ~3 significant digits, through 27 layers)
    want = fp32.prefill(ids).logits
    other = fp32.prefill(_prompt(300, seed=7)).logits
    assert (result.logits - want).abs().max() < 0.2 * (other - want).abs().max()
    # its KV crosses as fp32, exactly the bf16 values
    layer = result.kv.export_layer(3, 0, 300)
    arrays = dict(layer_kv_to_arrays(layer))
    assert arrays["latent"].dtype == np.float32
    assert torch.equal(torch.from_numpy(arrays["latent"]).to(torch.bfloat16),
                       layer.tensors["latent"])
    back = layer_kv_from_arrays(3, "mla", 0, 300, sorted(arrays.items()), "cpu", torch.bfloat16)
    assert torch.equal(back.tensors["latent"], layer.tensors["latent"])
    # and imports back into the bf16 engine bitwise
    kv = bf16.import_kv(result.kv.export(0, 300), None, ids)
    assert torch.equal(kv.export_layer(3, 0, 300).tensors["latent"], layer.tensors["latent"])


def test_the_wire_still_refuses_what_does_not_widen_exactly() -> None:
    layer = LayerKV(0, "mla", 0, 2, {"latent": torch.zeros(2, 4, dtype=torch.float64)})
    with pytest.raises(ConfigError, match="float32"):
        layer_kv_to_arrays(layer)


def test_the_kimi_linear_preset_has_its_geometry_and_active_size() -> None:
    """Against the catalog's Kimi-Linear-48B-A3B (HF config.json): the preset's KV geometry
    per token and per layer kind; its parameter count from shapes alone (a meta-device model:
    nothing is allocated)."""
    cfg = EngineConfig.kimi_linear()
    assert (cfg.hidden, cfg.num_layers, cfg.num_heads, cfg.head_dim) == (2304, 27, 32, 128)
    assert [i for i, k in enumerate(cfg.layer_pattern) if k == "M"] == [3, 7, 11, 15, 19, 23, 26]
    spec, real = cfg.to_spec(), find_model("Kimi-Linear-48B-A3B")
    ours = {g.kind: g for g in spec.layers}
    theirs = {g.kind: g for g in real.layers}
    assert ours["mla"].count == theirs["mla"].count == 7
    assert ours["linear"].count == theirs["linear"].count == 20
    assert ours["mla"].kv_lora_rank + ours["mla"].rope_head_dim == 576
    for key in ("kv_lora_rank", "rope_head_dim"):
        assert getattr(ours["mla"], key) == getattr(theirs["mla"], key)
    for key in ("heads", "k_head_dim", "v_head_dim", "conv_channels", "conv_kernel"):
        assert getattr(ours["linear"], key) == getattr(theirs["linear"], key)
    tiny = {g.kind: g for g in EngineConfig.tiny().to_spec().layers}  # control: would fail
    assert tiny["mla"].kv_lora_rank != theirs["mla"].kv_lora_rank
    from prfaas.engine.model import HybridLM

    with torch.device("meta"):
        model = HybridLM(cfg, load=False)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    active = sum(sizes.values()) - sizes["embed"]  # an embedding row is read, not multiplied
    mlp = sum(v for n, v in sizes.items() if n.startswith("blocks.0.w_"))
    assert mlp == 3 * 2304 * 9216  # = 8 routed experts of 1024 + 1 shared, as one dense MLP
    assert 3.0e9 < active < 3.6e9  # the model's "A3B": ~3B activated per token


def test_a_cuda_device_on_this_machine_is_one_line_naming_it() -> None:
    assert not torch.cuda.is_available()  # this suite runs on CPU-only machines
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=rf"engine.device='{device}': no CUDA GPU here"):
            Engine(EngineConfig.tiny(device=device))
    with pytest.raises(ConfigError, match="cpu, cuda or cuda:N"):
        EngineConfig.tiny(device="gpu")
    with pytest.raises(ConfigError, match="prefill_chunk_tokens"):
        EngineConfig.tiny(prefill_chunk_tokens=100)
    assert dataclasses.replace(EngineConfig.tiny(), device="cuda:0").compute_dtype == "bf16"
    assert EngineConfig.tiny().compute_dtype == "fp32"


def test_generate_and_profile_refuse_cuda_here_in_one_line(tmp_path: Path) -> None:
    for args in (["generate", "--prompt", "hi", "--device", "cuda"],
                 ["profile", "--device", "cuda:0", "--out", str(tmp_path / "p.yaml")]):
        done = subprocess.run([sys.executable, "-m", "prfaas", *args], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "no CUDA GPU here" in lines[0] and "cuda" in lines[0]
    ok = subprocess.run([sys.executable, "-m", "prfaas", "generate", "--prompt", "hi",
                         "--device", "cpu", "--max-tokens", "2", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and '"device": "cpu"' in ok.stdout  # control: cpu runs


def test_the_gpu_settings_cut_the_kda_layers_launches() -> None:
    """The decision's basis, kept (benchmarks/bench_kda_launches.py, counted on the CPU): per
    64 tokens a KDA layer issues ~80 device operations with 64-token chunks, a few with the
    GPU settings; larger chunks with the per-sub-chunk loop (the control) stay in the tens."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_kda_launches as bench

    preset = bench.narrow_preset()
    tokens, chunk = 4096, 64  # the per-layer constant spreads over 64 sub-chunks
    kda = preset.layer_pattern.index("K")
    cpu, _ = bench.layer_counts(Engine(dataclasses.replace(preset, prefill_chunk_tokens=0)),
                                kda, tokens)
    gpu_engine = Engine(dataclasses.replace(preset, prefill_chunk_tokens=4096))
    gpu, _ = bench.layer_counts(gpu_engine, kda, tokens)
    with bench.loop_kda():
        loop, _ = bench.layer_counts(gpu_engine, kda, tokens)
    per = tokens // chunk
    assert cpu / per > 50 and loop / per > 15 and gpu / per < 5
