"""A roofline profile: T_prefill(l) and decode from hardware specs, for hardware nobody profiled.

Assumptions (stated, not measured):
- Prefill is compute-bound. FLOPs = 2 * active_params * l (dense matmuls) plus causal attention
  over the full-attention layers: 2 * 2 * q_heads * head_dim * l^2 / 2 per layer (QK^T and PV,
  half the pairs under the causal mask), plus linear-attention state updates
  ~ 4 * heads * k_head_dim * v_head_dim * l per linear layer. Achieved FLOP/s =
  peak_dense_bf16 * mfu (default 0.4, a typical large-model prefill MFU), times the GPUs of
  an instance. The fixed overhead c0 defaults to 0.3 s (scheduling, launch, and pipeline
  bubbles; the paper's H200 profile fits c0 = 0.389 s).
- Where a layer group does not give q_heads, 64 query heads are assumed; MLA attention uses the
  absorbed head dim kv_lora_rank + rope_head_dim for QK and kv_lora_rank for PV.
- Decode is memory-bound: a step reads the active weights once per instance plus each running
  sequence's KV; BS_max is what fits the TBT SLO.
These give order-of-magnitude plans; replace them with a measured profile when you have one.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.models.kv import geometry
from prfaas.models.profile import DecodeTime, HardwareProfile, KVSize, PrefillTime
from prfaas.models.spec import ModelSpec

DEFAULT_Q_HEADS = 64


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_bf16_tflops: float  # dense
    mem_bw_tbps: float  # TB/s
    mem_gib: float
    source: str


# Vendor datasheet figures (dense BF16, no sparsity). Rubin CPX: announced figures only
# (30 PFLOPS NVFP4, GDDR7 128 GB, ~2 TB/s); its BF16 rate is an assumption (1/4 of NVFP4).
GPUS: dict[str, GPUSpec] = {
    "H100": GPUSpec("H100", 989.0, 3.35, 80, "NVIDIA H100 SXM datasheet"),
    "H200": GPUSpec("H200", 989.0, 4.8, 141, "NVIDIA H200 SXM datasheet"),
    "H20": GPUSpec("H20", 148.0, 4.0, 96, "NVIDIA H20 published specs"),
    "B200": GPUSpec("B200", 2250.0, 8.0, 180, "NVIDIA B200 (HGX) datasheet"),
    "Rubin-CPX": GPUSpec("Rubin-CPX", 7500.0, 2.0, 128,
                         "announcement: 30 PF NVFP4; BF16 assumed 1/4 of that"),
}


def find_gpu(name: str) -> GPUSpec:
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise UnknownNameError("gpu", name, list(GPUS))


def _attention_flops_coeff(spec: ModelSpec) -> float:
    """FLOPs per l^2 (all full-attention layers, causal)."""
    coeff = 0.0
    for g in spec.layers:
        q_heads = g.q_heads or DEFAULT_Q_HEADS
        if g.kind == "gqa":
            coeff += g.count * 2 * q_heads * (g.k_head_dim + g.v_head_dim) / 2
        elif g.kind == "mla":
            coeff += g.count * 2 * q_heads * (2 * g.kv_lora_rank + g.rope_head_dim) / 2
    return coeff


def _linear_flops_per_token(spec: ModelSpec) -> float:
    return sum(4.0 * g.count * g.heads * g.k_head_dim * g.v_head_dim
               for g in spec.layers if g.kind == "linear")


def roofline_profile(spec: ModelSpec, gpu: str, gpus_per_instance: int = 8, mfu: float = 0.4,
                     overhead_s: float = 0.3, tbt_slo_s: float = 0.025,
                     mean_context_tokens: int = 32768) -> HardwareProfile:
    """A HardwareProfile for `spec` on `gpus_per_instance` GPUs of kind `gpu`."""
    if spec.params_active_b is None:
        raise ConfigError(f"model.{spec.name}.params_active_b", None,
                          "the roofline needs the model's active parameters")
    if not 0 < mfu <= 1:
        raise ConfigError("mfu", mfu, "must be in (0, 1]")
    hw = find_gpu(gpu)
    flops_per_s = hw.peak_bf16_tflops * 1e12 * mfu * gpus_per_instance
    active = spec.params_active_b * 1e9
    prefill = PrefillTime(
        c2=_attention_flops_coeff(spec) / flops_per_s,
        c1=(2 * active + _linear_flops_per_token(spec)) / flops_per_s,
        c0=overhead_s,
        source=f"roofline: {hw.name} x{gpus_per_instance}, mfu {mfu}",
    )
    kv = KVSize.from_geometry(geometry(spec))
    mem_bw = hw.mem_bw_tbps * 1e12 * gpus_per_instance
    weight_read_s = active * 2 / mem_bw  # bf16 weights, once per step
    kv_read_s = kv.bytes_for(mean_context_tokens) / mem_bw  # per running sequence
    bs_max = max(1, int((tbt_slo_s - weight_read_s) / kv_read_s)) if kv_read_s > 0 else 1
    step_s = weight_read_s + bs_max * kv_read_s
    decode = DecodeTime(bs_max, max(step_s, 1e-6), source=f"roofline: {hw.name} memory-bound")
    return HardwareProfile(f"{hw.name}-roofline", gpus_per_instance, prefill, decode, kv,
                           notes=__doc__ or "")
