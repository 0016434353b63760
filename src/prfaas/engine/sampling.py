"""Token sampling: greedy, or temperature + top-p with a per-request seed.

The random draw for output token number `step` uses a generator seeded from (seed, step), not a
generator carried along: the same request samples the same tokens whichever process produced
which step (the first token on a prefill node, the rest on a decode node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prfaas.core.errors import ConfigError

_STEP_STRIDE = 1_000_003  # a prime: (seed, step) pairs map to distinct generator seeds


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError("temperature", self.temperature, "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", self.top_p, "must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, step: int) -> int:
    """One token from logits [vocab] for output position `step` (0 = the prefill's token)."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    # keep the smallest prefix of tokens whose mass reaches top_p (always at least one)
    keep = (torch.cumsum(sorted_p, dim=0) - sorted_p) < params.top_p
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    gen = torch.Generator().manual_seed((params.seed * _STEP_STRIDE + step) % 2**63)
    choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)
    return int(order[choice].item())
