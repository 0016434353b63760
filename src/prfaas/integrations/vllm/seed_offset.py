"""A resumed request's seeded sampling continues where the interrupted one stopped (vLLM).

vLLM seeds one torch.Generator per request (`SamplingParams.seed`) when the request enters the
Worker's input batch, and every sampled token draws from it: one row of exponential noise of
the vocabulary's size (`random_sample`, GPUs), or one seed for a fused Gumbel kernel
(`TopKTopPSampler.forward_cpu`, x86/Arm CPUs). A request resumed after `k` tokens is a new
request (prompt + those k tokens), so its generator would start over and sample other tokens
than the uninterrupted run. The decoder's `kv_transfer_params.prfaas.output_offset = k` (set
by the router on a resume) makes the Worker draw those k rows first, so draw k+1 samples token
k+1, as in the native engine's `output_offset`.

vLLM has no hook for this: `install` wraps `InputBatch.add_request` in the Worker process (the
connector's worker half calls it). Requests without an offset are untouched. Limits: penalties
that count output tokens only (presence, frequency) and `min_tokens` see the k tokens as
prompt, as does every other engine that takes them back as a prompt.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_advanced: weakref.WeakSet[Any] = weakref.WeakSet()  # generators already moved on


def output_offset(sampling_params: Any) -> int:
    extra = getattr(sampling_params, "extra_args", None) or {}
    params = (extra.get("kv_transfer_params") or {}).get("prfaas") or {}
    return int(params.get("output_offset") or 0)


def advance(generator: torch.Generator, draws: int, vocab_size: int,
            dtype: torch.dtype = torch.float32, per_token_seed: bool = False) -> None:
    """Consume what `draws` sampling steps take from a request's generator: one exponential
    noise row of the vocabulary's size (`random_sample`, vLLM's native/GPU path), or, on x86
    and Arm CPUs (`TopKTopPSampler.forward_cpu`), one 31-bit seed for its fused Gumbel kernel."""
    if per_token_seed:
        for _ in range(draws):
            torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long)
        return
    row = torch.empty(vocab_size, dtype=dtype)
    for _ in range(draws):
        row.exponential_(generator=generator)


def cpu_seeds(fp64_noise: bool) -> bool:
    """Whether this process's sampler takes per-token seeds (vLLM's forward_cpu choice)."""
    from vllm.platforms import CpuArchEnum, current_platform

    return bool(current_platform.is_cpu() and not fp64_noise and
                current_platform.get_cpu_architecture() not in (CpuArchEnum.RISCV,
                                                                 CpuArchEnum.POWERPC))


def install(fp64_noise: bool = False) -> None:
    """Wrap InputBatch.add_request once per process (idempotent)."""
    from vllm.v1.worker import gpu_input_batch

    cls: Any = gpu_input_batch.InputBatch
    if getattr(cls, "_prfaas_output_offset", False):
        return
    original = cls.add_request
    dtype = torch.float64 if fp64_noise else torch.float32
    per_token_seed = cpu_seeds(fp64_noise)

    def add_request(self: Any, request: Any) -> int:
        index: int = original(self, request)
        gen = getattr(request, "generator", None)
        k = output_offset(getattr(request, "sampling_params", None))
        if k > 0 and gen is not None and gen not in _advanced:  # once: not on a re-add
            advance(gen, k, int(self.vocab_size), dtype, per_token_seed)
            _advanced.add(gen)
        return index

    cls.add_request = add_request
    cls._prfaas_output_offset = True
