"""HybridLM: embedding -> pre-norm blocks (mixer + SwiGLU MLP) -> final norm -> LM head.

Weights come from the config's `weights`: `seed` (a private torch.Generator seeded with
`config.seed`, parameters filled in name order), `trained` (the shipped weights of the config's
`name`, engine/weights.py) or a user's safetensors file with exactly this model's names and
shapes.
`prefill` is layer-major and chunked: each layer runs over all new tokens in block-aligned
chunks of `block_size_tokens` before the next layer starts, and `kv_ready(i)` fires as soon as
layer i's cache for those tokens is final (the transport streams it while the rest computes):
- full attention (mla / gqa / swa): what is cached is a projection of the layer's input, so
  the layer projects every chunk's KV first, fires `kv_ready(i)`, then runs attention + MLP
  chunk by chunk. The KV leaves one attention + MLP earlier than "when the layer is done",
  which matters most for the last layer: with KDA:MLA 3:1 and 12 layers it holds ~28% of the
  bytes at 2K tokens (8 layers: ~43%), and without this none of it could leave before the
  prefill returned.
- linear (kda): the state is final only after the last chunk; `kv_ready(i)` fires at the end
  of the layer.
Projecting all chunks before attending runs the same operations on the same chunk shapes as
interleaving them would, so from-scratch and resumed prefills stay bitwise equal.
Chunks are `cfg.chunk_tokens` long: the block size by default (the bitwise contract above),
thousands of tokens on a GPU (`prefill_chunk_tokens`), where a resumed prefill then agrees
with one from scratch to rounding, not bitwise.
Weights are made on the CPU in float32 from the seed (the same values in every process,
whatever device it computes on), then `place` moves the rope tables to the engine's device
and dtype and turns on the fused attention kernels on a GPU (Engine moves the weights).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from prfaas.core.errors import ConfigError
from prfaas.engine.attention import GQA, MLA, Rope
from prfaas.engine.kda_layer import KDA
from prfaas.engine.kv import Store
from prfaas.engine.ops import proj, rms_norm, rope_tables, swiglu
from prfaas.engine.weights import read as read_weights
from prfaas.engine.weights import trained_path
from prfaas.models.engine_config import EngineConfig

Mixer = MLA | GQA | KDA


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape), requires_grad=False)


class Block(nn.Module):
    def __init__(self, cfg: EngineConfig, kind: str, rope: Rope) -> None:
        super().__init__()
        self.mixer: Mixer
        if kind == "linear":
            self.mixer = KDA(cfg)
        elif kind == "mla":
            self.mixer = MLA(cfg, rope)
        else:
            self.mixer = GQA(cfg, rope, cfg.window if kind == "swa" else 0)
        self.norm1, self.norm2 = _param(cfg.hidden), _param(cfg.hidden)
        self.w_gate = _param(cfg.mlp_hidden, cfg.hidden)
        self.w_up = _param(cfg.mlp_hidden, cfg.hidden)
        self.w_down = _param(cfg.hidden, cfg.mlp_hidden)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        return h + swiglu(rms_norm(h, self.norm2), self.w_gate, self.w_up, self.w_down)

    def prefill(self, x: torch.Tensor, start: int, store: Store, chunk: int, total: int,
                kv_ready: Callable[[], None] | None = None) -> torch.Tensor:
        """Tokens [start, start + len(x)) through this block, `chunk` tokens at a time;
        `kv_ready()` fires once the store holds this block's final cache for them (for full
        attention: after the KV projections, before attention and MLP; see the module doc)."""
        work: dict[str, Any] = {"total": total}
        spans = [(start + lo, x[lo:lo + chunk]) for lo in range(0, x.shape[0], chunk)]
        outs = []
        if isinstance(self.mixer, KDA):
            for pos, xc in spans:
                h = xc + self.mixer.prefill_chunk(rms_norm(xc, self.norm1), pos, store, work)
                outs.append(self._mlp(h))
            if kv_ready is not None:
                kv_ready()
            return torch.cat(outs)
        normed = [rms_norm(xc, self.norm1) for _pos, xc in spans]
        cached = [self.mixer.project_chunk(xn, pos, store, work)
                  for (pos, _xc), xn in zip(spans, normed, strict=True)]
        if kv_ready is not None:
            kv_ready()
        for (pos, xc), xn, kv in zip(spans, normed, cached, strict=True):
            outs.append(self._mlp(xc + self.mixer.attend_chunk(xn, pos, store, work, kv)))
        return torch.cat(outs)

    def decode(self, x: torch.Tensor, stores: list[Store], positions: torch.Tensor,
               ) -> torch.Tensor:
        return self._mlp(x + self.mixer.decode(rms_norm(x, self.norm1), stores, positions))

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp(x + self.mixer.forward_full(rms_norm(x, self.norm1)))


class HybridLM(nn.Module):
    def __init__(self, cfg: EngineConfig, load: bool = True) -> None:
        """`load` False: every weight zero (Engine loads them with `load_weights`, moving each
        to the device as it goes, so the CPU never holds all of a large model at once)."""
        super().__init__()
        self.cfg = cfg
        ropes = {dim: Rope(*rope_tables(cfg.max_context_tokens, dim, cfg.rope_theta))
                 for dim in {cfg.rope_head_dim, cfg.head_dim}}
        self.ropes = list(ropes.values())
        self.embed = _param(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(
            Block(cfg, cfg.kind_of(i),
                  ropes[cfg.rope_head_dim if cfg.kind_of(i) == "mla" else cfg.head_dim])
            for i in range(cfg.num_layers))
        self.final_norm = _param(cfg.hidden)
        self.lm_head = _param(cfg.vocab_size, cfg.hidden)
        if load:
            self.load_weights()

    def block(self, index: int) -> Block:
        return cast(Block, self.blocks[index])

    def mixer(self, index: int) -> Mixer:
        return self.block(index).mixer

    def place(self, device: torch.device, dtype: torch.dtype) -> None:
        """Rope tables to `device` / `dtype`; fused attention kernels on a GPU (the weights
        are moved by the caller, one at a time)."""
        for rope in self.ropes:
            rope.cos, rope.sin = rope.cos.to(device, dtype), rope.sin.to(device, dtype)
        for block in self.blocks:
            mixer = cast(Block, block).mixer
            if isinstance(mixer, (MLA, GQA)):
                mixer.fused_attention = device.type == "cuda"

    def load_weights(self, after: Callable[[str, nn.Parameter], None] | None = None) -> None:
        """The config's weights (`seed`, `trained` or a file); `after(name, p)` on each
        parameter once it holds its value, in name order."""
        if self.cfg.weights == "seed":
            self.init_from_seed(self.cfg.seed, after)
            return
        trained = self.cfg.weights == "trained"
        self.load_safetensors(trained_path(self.cfg.name) if trained else self.cfg.weights,
                              trained=trained)
        if after is not None:
            for name, p in sorted(self.named_parameters()):
                after(name, p)

    def init_from_seed(self, seed: int,
                       after: Callable[[str, nn.Parameter], None] | None = None) -> None:
        """Fill every weight from `seed`, in name order; `after(name, p)` right after each."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            self._fill(name, p, gen)
            if after is not None:
                after(name, p)

    @staticmethod
    def _fill(name: str, p: nn.Parameter, gen: torch.Generator) -> None:
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in leaf:
            p.fill_(1.0)
        elif leaf == "a_log":  # per-token decay exp(-a * softplus(.)) with a in [0.02, 0.3]
            p.copy_(torch.empty(p.shape).uniform_(0.02, 0.3, generator=gen).log())
        elif leaf == "dt_bias":
            p.zero_()
        elif leaf == "embed":
            p.normal_(0.0, 1.0, generator=gen)
        elif leaf == "conv_w":
            p.normal_(0.0, 0.5, generator=gen)
        else:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)

    def load_safetensors(self, path: str | Path, trained: bool = False) -> None:
        """Every parameter from `path` (packed or plain safetensors, engine/weights.py)."""
        if not Path(path).is_file():
            raise ConfigError("weights_path", str(path), "no such file")
        loaded = read_weights(path)
        own = dict(self.named_parameters())
        missing, extra = sorted(set(own) - set(loaded)), sorted(set(loaded) - set(own))
        # the shipped weights fit their preset's shape only
        hint = (f" (the trained weights of {self.cfg.name} fit its preset's shape; another "
                "shape needs weights: seed)") if trained else ""
        if missing or extra:
            raise ConfigError("weights_path", str(path), f"names differ: missing "
                              f"{missing[:5]}, unexpected {extra[:5]}{hint}")
        for name, tensor in loaded.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ConfigError(f"weights[{name}]", tuple(tensor.shape),
                                  f"expected shape {tuple(own[name].shape)}{hint}")
            own[name].copy_(tensor.float())

    def save_safetensors(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.named_parameters()}, str(path))

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """[N, D] -> [N, vocab]."""
        return proj(rms_norm(last_hidden, self.final_norm), self.lm_head)

    def prefill(self, token_ids: torch.Tensor, start: int, stores: list[Store], total: int,
                kv_ready: Callable[[int], None] | None = None,
                all_logits: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Run tokens [start, start + len) through every layer; returns last-position logits.
        `kv_ready(i)` fires once per layer, in layer order, as soon as stores[i] holds layer
        i's final cache for these tokens (before layer i's attention for full attention).
        `all_logits`, when given, receives the logits of every position [T, vocab] (for
        prompt logprobs; the returned last row is computed on its own, as without it)."""
        x = self.embed[token_ids]  # [T, D]
        for i in range(len(self.blocks)):
            ready = None if kv_ready is None else partial(kv_ready, i)
            x = self.block(i).prefill(x, start, stores[i], self.cfg.chunk_tokens, total, ready)
        if all_logits is not None:
            all_logits.append(self.logits(x))  # [T, vocab]
        return self.logits(x[-1:])[0]

    def decode(self, token_ids: torch.Tensor, stores: list[list[Store]]) -> torch.Tensor:
        """One token per sequence; stores[layer][seq]. Returns logits [B, vocab]."""
        positions = torch.tensor([s.num_tokens for s in stores[0]], device=self.embed.device)
        x = self.embed[token_ids]  # [B, D]
        for i in range(len(self.blocks)):
            x = self.block(i).decode(x, stores[i], positions)
        return self.logits(x)

    def forward_full(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Plain reference forward over a whole sequence (no cache, no chunks, no hooks):
        logits of the last position."""
        x = self.embed[token_ids]
        for i in range(len(self.blocks)):
            x = self.block(i).forward_full(x)
        return self.logits(x[-1:])[0]

