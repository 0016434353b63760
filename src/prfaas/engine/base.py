"""EngineBase: the one interface prefill and decode workers call, whatever computes.

A worker prefills layer by layer with a per-layer hook (`prefill`), rebuilds a cache from
received layers (`import_kv`), starts a running sequence from the prefill's logits (`start`)
and steps a continuous batch (`decode_step`). Implementations: the torch hybrid model
(engine.py) and the emulated engine (emulated/engine.py: compute time from a hardware profile);
a vLLM worker is another program and does not implement it (serve/engines.py). What is written
here is common to both: prompt and prefix checks, sampling the first token, the reference
`generate` loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from prfaas.core.errors import ConfigError
from prfaas.engine.kv import LayerKV, SequenceKV
from prfaas.engine.penalties import TokenHistory
from prfaas.engine.sampling import Sampled, SamplingParams, is_stop, sample_full
from prfaas.models.engine_config import EngineConfig
from prfaas.models.tokenizer import ByteTokenizer


@dataclass
class PrefillResult:
    kv: SequenceKV
    logits: torch.Tensor  # [vocab], last prompt position
    first_token: int  # greedy
    num_computed_tokens: int  # tokens computed in this call (prompt minus cached prefix)
    prompt_logits: torch.Tensor | None = None  # [computed, vocab] when asked (all_logits)


@dataclass
class DecodeSeq:
    """A running request: its cache, the token to feed next and its sampling settings.
    `step` is the output index of the token the next decode step produces; `history` holds
    the tokens penalties look at (None when the request has no penalty); `last` is the last
    sampled token with its logprobs."""

    kv: SequenceKV
    last_token: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    step: int = 1
    history: TokenHistory | None = None
    last: Sampled | None = None


class EngineBase(ABC):
    """What a worker needs of an engine; `config` gives the model's shape (the layer pattern
    the KV is shipped in, the block size the prefix cache uses)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = ByteTokenizer()

    @abstractmethod
    def new_kv(self) -> SequenceKV:
        """An empty cache of this engine's layers."""

    @abstractmethod
    def prefill(self, token_ids: list[int], prefix: SequenceKV | None = None,
                on_layer: Callable[[LayerKV], None] | None = None,
                all_logits: bool = False) -> PrefillResult:
        """Compute the uncached part of the prompt; `on_layer` gets each layer's KV once final."""

    @abstractmethod
    def import_kv(self, layers: list[LayerKV], prefix: SequenceKV | None = None,
                  token_ids: list[int] | None = None) -> SequenceKV:
        """Rebuild a sequence's cache from received layers (plus a local cached prefix)."""

    @abstractmethod
    def decode_step(self, batch: list[DecodeSeq]) -> list[int]:
        """Feed each sequence's last token, return one new token per sequence."""

    def place_state(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A received linear-layer state (host float32 tensors) where this engine keeps
        states; as it is by default (an engine on the CPU)."""
        return tensors

    def _check_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ConfigError("token_ids", token_ids, "empty prompt")
        if len(token_ids) > self.config.max_context_tokens:
            raise ConfigError("token_ids", f"{len(token_ids)} tokens",
                              f"longer than max_context_tokens={self.config.max_context_tokens}")
        bad = [t for t in token_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ConfigError("token_ids", bad[:5], f"outside [0, {self.config.vocab_size})")

    def _check_prefix(self, token_ids: list[int], prefix: SequenceKV | None) -> int:
        if prefix is None:
            return 0
        n, block = prefix.num_tokens, self.config.block_size_tokens
        if n % block:
            raise ConfigError("prefix.num_tokens", n, f"not a multiple of block size {block}")
        if n >= len(token_ids):
            raise ConfigError("prefix.num_tokens", n,
                              f"must be shorter than the prompt ({len(token_ids)} tokens)")
        if prefix.token_ids is not None and prefix.token_ids[:n] != token_ids[:n]:
            raise ConfigError("prefix", "token mismatch", "cached prefix is of another prompt")
        return n

    def start(self, kv: SequenceKV, logits: torch.Tensor, params: SamplingParams,
              prompt_ids: list[int], output_offset: int = 0) -> DecodeSeq:
        """A running sequence from a prefilled cache: its next token sampled from the last
        position's logits. `output_offset` > 0 continues a request whose last that many
        tokens of `prompt_ids` were its own output (a resumed request): they count as output
        for penalties, and the draw is output step `output_offset`, as if never interrupted."""
        if not 0 <= output_offset < len(prompt_ids):
            raise ConfigError("output_offset", output_offset,
                              f"must be in [0, {len(prompt_ids)}) for this prompt")
        cut = len(prompt_ids) - output_offset
        history = None
        if params.penalized:
            history = TokenHistory(prompt_ids[:cut], self.config.vocab_size)
            for token in prompt_ids[cut:]:
                history.add(token)
        first = sample_full(logits, params, output_offset, history, self.tokenizer.eos_id)
        if history is not None:
            history.add(first.token)
        return DecodeSeq(kv, first.token, params, output_offset + 1, history, first)

    def generate(self, token_ids: list[int], max_tokens: int,
                 sampling: SamplingParams | None = None) -> list[int]:
        """Prefill then decode one request alone; stops at max_tokens, EOS or a stop token id
        (not returned)."""
        return [s.token for s in self.generate_sampled(token_ids, max_tokens, sampling)]

    def generate_sampled(self, token_ids: list[int], max_tokens: int,
                         sampling: SamplingParams | None = None) -> list[Sampled]:
        """`generate` with each output token's logprobs (`sampling.logprobs` alternatives)."""
        params = sampling or SamplingParams()
        if max_tokens <= 0:
            raise ConfigError("max_tokens", max_tokens, "must be positive")
        if len(token_ids) + max_tokens > self.config.max_context_tokens + 1:
            raise ConfigError("max_tokens", max_tokens, "prompt + output exceed the context")
        result = self.prefill(token_ids)
        seq = self.start(result.kv, result.logits, params, token_ids)
        out: list[Sampled] = []
        while True:
            assert seq.last is not None
            if is_stop(seq.last_token, params, self.tokenizer.eos_id):
                break
            out.append(seq.last)
            if len(out) >= max_tokens:
                break
            self.decode_step([seq])
        return out
