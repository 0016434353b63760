"""vLLM's repetition, frequency and presence penalties over one request's own tokens.

As vLLM (`apply_penalties`): `repetition_penalty` r applies to every token seen in the prompt
OR the output so far: a positive logit is divided by r, a negative one multiplied by it;
`frequency_penalty` f and `presence_penalty` p follow OpenAI's definition and see the output
only: logit -= f * count + p * (count > 0). Counts are kept incrementally per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from prfaas.engine.sampling import SamplingParams


class TokenHistory:
    """A request's prompt-token mask and output-token counts over the vocabulary."""

    def __init__(self, prompt_ids: list[int], vocab_size: int) -> None:
        ids = torch.tensor([t for t in prompt_ids if 0 <= t < vocab_size], dtype=torch.long)
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool)
        self.prompt_mask[ids] = True
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)
        self.num_output = 0

    def add(self, token: int) -> None:
        if 0 <= token < self.output_counts.shape[0]:
            self.output_counts[token] += 1.0
        self.num_output += 1


def apply_penalties(logits: torch.Tensor, history: TokenHistory,
                    params: SamplingParams) -> torch.Tensor:
    """logits [vocab] (float32) -> penalized logits [vocab]; the input is not modified."""
    x = logits.float()
    seen_out = history.output_counts > 0
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        seen = history.prompt_mask | seen_out
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if params.frequency_penalty != 0.0:
        x = x - params.frequency_penalty * history.output_counts
    if params.presence_penalty != 0.0:
        x = x - params.presence_penalty * seen_out.float()
    return x
