"""Token sampling with vLLM's parameters and a per-request seed.

Order, as vLLM's sampler: the model's logits -> logprobs (log-softmax of those raw logits,
what `logprobs` reports) -> `logit_bias` -> `min_tokens` (EOS and `stop_token_ids` masked while
fewer outputs) -> penalties (penalties.py) -> greedy argmax when temperature is 0, else
temperature, `min_p`, `top_k`, `top_p`, one seeded draw. Everything is a function of one row
of logits and that request's own history, so a request samples the same tokens alone or in
any batch.

The random draw for output token number `step` uses a generator seeded from (seed, step), not a
generator carried along: the same request samples the same tokens whichever process produced
which step (the first token on a prefill node, the rest on a decode node).

Sampling runs on the CPU: the seeded draw is a CPU generator's, so a GPU engine hands its logits
over as CPU float32 (engine.py), and logits given here on a device are moved first (a greedy
argmax with no bias, penalty or minimum stays where the logits are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from prfaas.core.errors import ConfigError
from prfaas.engine.penalties import TokenHistory, apply_penalties
from prfaas.models.card import MAX_LOGPROBS

_STEP_STRIDE = 1_000_003  # a prime: (seed, step) pairs map to distinct generator seeds
_SEQ_STRIDE = 7_919  # sequence i > 0 of one request (n > 1) draws from seed + i * stride


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    top_k: int = -1  # -1 = all tokens
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # top alternatives to report per output token (None: none)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    def __post_init__(self) -> None:
        _check(self.temperature >= 0.0 and math.isfinite(self.temperature), "temperature",
               self.temperature, "must be a finite number >= 0")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1]")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k,
               "must be -1 (all tokens) or >= 1")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, value, "must be in [-2, 2]")
        _check(0.0 < self.repetition_penalty < math.inf, "repetition_penalty",
               self.repetition_penalty, "must be a finite number > 0")
        _check(self.min_tokens >= 0, "min_tokens", self.min_tokens, "must be >= 0")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
               "must be non-negative token ids")
        _check(all(t >= 0 and -100.0 <= b <= 100.0 for t, b in self.logit_bias), "logit_bias",
               self.logit_bias, "token ids >= 0 with biases in [-100, 100]")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               self.logprobs, f"must be in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def for_sequence(self, index: int) -> SamplingParams:
        """The params of sequence `index` of an n > 1 request: its own seed (0 keeps it)."""
        if index == 0:
            return self
        return replace(self, seed=(self.seed + index * _SEQ_STRIDE) % 2**62)


def is_stop(token: int, params: SamplingParams, eos_id: int) -> bool:
    """Whether `token` ends the sequence (it is not returned): EOS unless `ignore_eos`, or
    one of `stop_token_ids`."""
    return (token == eos_id and not params.ignore_eos) or token in params.stop_token_ids


def _check(ok: bool, field: str, value: object, reason: str) -> None:
    if not ok:
        raise ConfigError(field, value, reason)


@dataclass(frozen=True, slots=True)
class Sampled:
    """A sampled token with its logprob and the top alternatives (log-softmax of the raw
    logits: the model's distribution, before penalties and temperature, as vLLM reports)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> Sampled:
    """`token`'s logprob under `logits` [vocab] and the `k` most likely tokens (ties by id)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        values, order = torch.sort(logp, descending=True, stable=True)
        top = tuple((int(i), float(v)) for i, v in zip(order[:k], values[:k], strict=True))
    return Sampled(token, float(logp[token]), top)


def sample(logits: torch.Tensor, params: SamplingParams, step: int) -> int:
    """One token from logits [vocab] for output position `step` (0 = the prefill's token),
    with no history (penalties see no tokens) and no stop tokens to hold back."""
    return choose(logits, params, step, None, ())


def sample_full(logits: torch.Tensor, params: SamplingParams, step: int,
                history: TokenHistory | None, eos_id: int) -> Sampled:
    """`choose` plus the logprobs `params.logprobs` asks for (always the token's own)."""
    stops = params.stop_token_ids if params.ignore_eos else (eos_id, *params.stop_token_ids)
    token = choose(logits, params, step, history, stops)
    return token_logprobs(logits, token, params.logprobs or 0)


def choose(logits: torch.Tensor, params: SamplingParams, step: int,
           history: TokenHistory | None, stop_ids: tuple[int, ...]) -> int:
    plain = not (params.logit_bias or (step < params.min_tokens and stop_ids)
                 or (params.penalized and history is not None))
    x = logits if params.greedy and plain else logits.cpu()
    if params.logit_bias:
        x = x.clone()
        for token, bias in params.logit_bias:
            if token < x.shape[0]:
                x[token] += bias
    if step < params.min_tokens and stop_ids:
        x = x.clone()
        x[[t for t in stop_ids if t < x.shape[0]]] = float("-inf")
    if params.penalized and history is not None:
        x = apply_penalties(x, history, params)
    if params.greedy:
        return int(torch.argmax(x).item())
    probs = torch.softmax(x.double() / params.temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    if params.min_p > 0.0 or params.top_k > 0:
        keep = torch.ones_like(sorted_p, dtype=torch.bool)
        if params.min_p > 0.0:
            keep &= sorted_p >= params.min_p * sorted_p[0]
        if params.top_k > 0:
            keep[params.top_k:] = False
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        sorted_p = sorted_p / sorted_p.sum()
    # keep the smallest prefix of tokens whose mass reaches top_p (always at least one)
    keep = (torch.cumsum(sorted_p, dim=0) - sorted_p) < params.top_p
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    gen = torch.Generator().manual_seed((params.seed * _STEP_STRIDE + step) % 2**63)
    choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)
    return int(order[choice].item())


def prompt_logprobs(token_ids: list[int], logits: torch.Tensor, k: int) -> list[Sampled]:
    """Logprobs of prompt tokens 1.. under the logits of the position before each
    (`logits` [len(token_ids), vocab], a from-scratch prefill's `prompt_logits`)."""
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)  # [L-1, vocab]
    targets = torch.tensor(token_ids[1:], dtype=torch.long, device=logp.device)
    own = logp.gather(1, targets[:, None])[:, 0].tolist()
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(own)
    if k > 0:
        values, order = torch.sort(logp, dim=-1, descending=True, stable=True)
        tops = [tuple(zip(o, v, strict=True)) for o, v in
                zip(order[:, :k].tolist(), values[:, :k].tolist(), strict=True)]
    return [Sampled(t, lp, top) for t, lp, top in zip(token_ids[1:], own, tops, strict=True)]
