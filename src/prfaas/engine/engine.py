"""Engine: the torch hybrid model behind the workers' interface (base.py: prefill with a
per-layer hook, KV import, batched decode, one-process generate).

Exactness contract: with the same config (threads included) a prefill that resumes from a
cached block boundary gives bitwise the same KV and logits as a prefill from scratch, and a
request's decode step gives bitwise the same logits alone or in any batch (threads=1; see
ops.proj). So a request prefilled remotely from a cached prefix, shipped over TCP and decoded
in a continuous batch yields the same greedy tokens as `generate`.

On a GPU (`config.device` cuda, bf16 by default) the engine is the same code on device tensors:
weights made on the CPU from the seed (so every process, on any device, has the same model) and
moved one at a time; KV, states and work buffers on the device; logits handed to sampling on the
CPU (a request's seeded draws are the same whichever process, on whichever device, makes them).
The exactness contract above is the CPU engine's; on a GPU results agree to rounding.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import torch
from torch import nn

from prfaas.core.errors import ConfigError
from prfaas.engine.base import DecodeSeq, EngineBase, PrefillResult
from prfaas.engine.kv import ATTN_KINDS, AttnStore, LayerKV, LinearStore, SequenceKV, Store
from prfaas.engine.model import HybridLM
from prfaas.engine.sampling import sample_full
from prfaas.models.engine_config import EngineConfig, device_index

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def torch_device(config: EngineConfig) -> torch.device:
    """The config's device, checked here: a CUDA device on a machine without one, or past
    the GPUs it has, is a one-line ConfigError naming the device."""
    if config.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else f"; torch {torch.__version__} is a CPU build"
        raise ConfigError("engine.device", config.device,
                          f"no CUDA GPU here (torch.cuda.is_available() is False{build})")
    count, index = torch.cuda.device_count(), device_index(config.device)
    if index is not None and index >= count:
        raise ConfigError("engine.device", config.device,
                          f"this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})")
    return torch.device(config.device)


class Engine(EngineBase):
    """The model plus the cache operations workers need. Constructing one sets torch's
    intra-op thread count for the whole process to `config.threads` (exactness depends on it:
    every process that must agree bitwise runs the same config)."""

    def __init__(self, config: EngineConfig | None = None, weights_path: str | None = None,
                 digest_weights: bool = True) -> None:
        """`digest_weights`: on a device other than the CPU in float32, hash the float32
        weights as they are made (`weights_sha256`: a worker's manifest identity); the
        one-process CLI commands skip it."""
        config = config or EngineConfig.tiny()
        if weights_path is not None:  # a file given here overrides the config's weights
            config = dataclasses.replace(config, weights=str(weights_path))
        super().__init__(config)
        self.device = torch_device(self.config)
        self.dtype = DTYPES[self.config.compute_dtype]
        torch.set_num_threads(self.config.threads)
        self._weights_sha256: str | None = None
        self._on_host = self.device.type == "cpu" and self.dtype == torch.float32
        with torch.inference_mode():
            if self._on_host:
                self.model = HybridLM(self.config)
            else:
                self._build_placed(digest_weights)

    def _build_placed(self, digest: bool) -> None:
        """The model made in float32 on the CPU and moved one weight at a time (a 3.7B model's
        float32 copy never exists whole), hashed on the way when `digest`."""
        h = hashlib.sha256() if digest else None

        def move(name: str, p: nn.Parameter) -> None:
            if h is not None:
                _hash_weight(h, name, p.detach())
            p.data = p.data.to(self.device, self.dtype)

        self.model = HybridLM(self.config, load=False)
        self.model.load_weights(move)
        self.model.place(self.device, self.dtype)
        if h is not None:
            self._weights_sha256 = h.hexdigest()

    @property
    def weights_sha256(self) -> str:
        """SHA-256 over every weight's name and float32 bytes, in name order: the same for
        the same model on any device (a manifest's model identity, serve/worker/manifest.py)."""
        if self._weights_sha256 is None:
            if not self._on_host:
                raise ConfigError("engine", self.config.device,
                                  "built with digest_weights=False: no weight digest")
            h = hashlib.sha256()
            for name, tensor in sorted(self.model.state_dict().items()):
                _hash_weight(h, name, tensor)
            self._weights_sha256 = h.hexdigest()
        return self._weights_sha256

    def place_state(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A received linear state (float32 host tensors) on this engine's device: the
        recurrent state stays float32, the conv state takes the compute dtype."""
        return {n: t.to(self.device, torch.float32 if n == "state" else self.dtype)
                for n, t in tensors.items()}

    def new_kv(self) -> SequenceKV:
        stores: list[Store] = [self.model.mixer(i).new_store()
                               for i in range(self.config.num_layers)]
        return SequenceKV(stores, [])

    def prefill(self, token_ids: list[int], prefix: SequenceKV | None = None,
                on_layer: Callable[[LayerKV], None] | None = None,
                all_logits: bool = False) -> PrefillResult:
        """Compute the uncached part of the prompt, layer by layer; `on_layer` gets each
        layer's KV of the tokens computed here (full attention) or its state at the end.

        `on_layer` is called once per layer, in layer order, as soon as that layer's KV is
        final, which for a full-attention layer (mla / gqa / swa) is right after its KV
        projections, BEFORE its attention and MLP run (its cache is a projection of the
        layer's input); for a linear layer it is when the layer is done. So a streaming
        caller can start sending layer i's KV while layer i itself is still computing. Later
        compute never writes to what the hook received (attention rows are gathered copies,
        linear states are replaced, never modified), and it is bitwise what
        `result.kv.export_layer(i, start, end)` gives after the prefill. `all_logits` also
        returns every computed position's logits (`prompt_logits`, for prompt logprobs)."""
        self._check_prompt(token_ids)
        start = self._check_prefix(token_ids, prefix)
        kv = prefix.snapshot_at(start) if prefix is not None else self.new_kv()
        kv.token_ids = list(token_ids)
        end = len(token_ids)

        def kv_ready(i: int) -> None:
            if on_layer is not None:
                on_layer(kv.export_layer(i, start, end))

        every: list[torch.Tensor] | None = [] if all_logits else None
        with torch.inference_mode():
            ids = torch.tensor(token_ids[start:], dtype=torch.long, device=self.device)
            logits = _host(self.model.prefill(ids, start, kv.stores, end, kv_ready, every))
        return PrefillResult(kv, logits, int(torch.argmax(logits).item()), end - start,
                             _host(every[0]) if every else None)

    def import_kv(self, layers: list[LayerKV], prefix: SequenceKV | None = None,
                  token_ids: list[int] | None = None) -> SequenceKV:
        """Rebuild a sequence's cache from received layers (plus the local cached prefix
        [0, start) for full-attention layers)."""
        blocks = self.model.blocks
        if len(layers) != len(blocks):
            raise ConfigError("layers", len(layers), f"expected {len(blocks)} layers")
        base = prefix.num_tokens if prefix is not None else 0
        old = prefix.snapshot_at(base).stores if prefix is not None and base else None
        stores: list[Store] = []
        for i, layer in enumerate(sorted(layers, key=lambda x: x.layer_index)):
            stores.append(self._import_layer(i, layer, base, old[i] if old else None))
        ends = {s.num_tokens for s in stores}
        if len(ends) != 1:
            raise ConfigError("layers", sorted(ends), "layers end at different tokens")
        return SequenceKV(stores, list(token_ids) if token_ids is not None else None)

    def _import_layer(self, i: int, layer: LayerKV, base: int, old: Store | None) -> Store:
        mixer = self.model.mixer(i)
        if layer.layer_index != i or layer.kind != mixer.kind:
            raise ConfigError(f"layers[{i}]", (layer.layer_index, layer.kind),
                              f"expected layer {i} of kind {mixer.kind}")
        if mixer.kind == "linear":
            every = self.config.block_size_tokens * self.config.snapshot_every_blocks
            store_l = old if isinstance(old, LinearStore) else LinearStore({}, 0, every)
            store_l.advance(self.place_state(layer.tensors), layer.end_token)
            return store_l
        if layer.kind == "swa":  # the window tail is the whole state a continuation needs
            store_a = AttnStore("swa", self.config.block_size_tokens, self.config.window,
                                layer.start_token)
        else:
            if layer.start_token != base:
                raise ConfigError(f"layers[{i}].start_token", layer.start_token,
                                  f"must equal the cached prefix length {base}")
            fresh = mixer.new_store()
            assert isinstance(fresh, AttnStore)
            store_a = old if isinstance(old, AttnStore) else fresh
        assert layer.kind in ATTN_KINDS
        store_a.append({n: t.to(self.device, self.dtype) for n, t in layer.tensors.items()})
        return store_a

    def decode_logits(self, batch: list[DecodeSeq]) -> torch.Tensor:
        """Feed each sequence's last token and append its KV; the next logits [B, vocab]."""
        for seq in batch:
            if seq.kv.num_tokens >= self.config.max_context_tokens:
                raise ConfigError("context", seq.kv.num_tokens, "max_context_tokens reached")
        with torch.inference_mode():
            ids = torch.tensor([s.last_token for s in batch], dtype=torch.long, device=self.device)
            per_layer = [[s.kv.stores[i] for s in batch] for i in range(self.config.num_layers)]
            logits = self.model.decode(ids, per_layer)
        for seq in batch:
            if seq.kv.token_ids is not None:
                seq.kv.token_ids.append(seq.last_token)
        return logits

    def decode_step(self, batch: list[DecodeSeq]) -> list[int]:
        """Feed each sequence's last token, append its KV, return one new token per sequence
        (its logprobs are on `seq.last`)."""
        if not batch:
            return []
        tokens = []
        for seq, row in zip(batch, _host(self.decode_logits(batch)), strict=True):
            seq.last = sample_full(row, seq.sampling, seq.step, seq.history,
                                   self.tokenizer.eos_id)
            if seq.history is not None:
                seq.history.add(seq.last.token)
            seq.last_token, seq.step = seq.last.token, seq.step + 1
            tokens.append(seq.last_token)
        return tokens


def _host(logits: torch.Tensor) -> torch.Tensor:
    """Logits for sampling: float32 on the CPU (the same tensor on the CPU engine)."""
    return logits.float().cpu()


def _hash_weight(h: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    h.update(name.encode())
    h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
