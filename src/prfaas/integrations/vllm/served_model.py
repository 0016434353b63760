"""What the router needs to know of a model vLLM serves: name, context, tokenizer, KV geometry.

Read from the model directory (config.json, tokenizer.json) with `tokenizers` only: the router
never imports vLLM, transformers or torch. `spec()` gives the planner's KV geometry from the HF
config (GQA layers, Gated DeltaNet layers as `linear` with their conv state), so link pending
bytes and transfer-time deadlines use the real model's sizes (bf16 KV and state, as vLLM CPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.models.spec import LayerGroup, ModelSpec
from prfaas.serve.vllm_settings import VllmSettings


class HFTokenizer:
    """encode/decode/vocab_size/eos_id over a tokenizer.json (BOS not added: vLLM's
    completion endpoint tokenizes the same way for this tokenizer, which has no template)."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ConfigError("vllm.model.dir", str(model_dir), "has no tokenizer.json")
        self._tok = Tokenizer.from_file(str(path))
        config = _config(model_dir)
        self.vocab_size = int(config["vocab_size"])
        self.eos_id = int(config.get("eos_token_id", 1))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=True)
        return text


_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
           "half": "fp16"}


def _config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError("vllm.model.dir", str(model_dir), "has no config.json")
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The duck type of EngineConfig that RouterService reads."""

    name: str
    max_context_tokens: int
    block_size_tokens: int
    model_dir: str
    args: tuple[str, ...] = ()  # the instances' vLLM arguments (--dtype, the SSM cache dtype)

    @classmethod
    def from_settings(cls, s: VllmSettings) -> ServedModel:
        return cls(s.served_name, s.max_model_len, s.block_size_tokens, s.model_dir, s.args)

    def _arg(self, flag: str) -> str | None:
        args = list(self.args)
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None

    def dtypes(self) -> tuple[str, str]:
        """The KV dtype (vLLM's --dtype; `auto` on this CPU build runs our fp32-saved models
        in bf16) and the recurrent state's (--mamba-ssm-cache-dtype, else the KV's): what
        the router predicts KV bytes and transfer deadlines with."""
        kv = _DTYPES.get(str(self._arg("--dtype") or "auto"), "bf16")
        state = _DTYPES.get(str(self._arg("--mamba-ssm-cache-dtype") or "auto")) or kv
        return kv, state

    def tokenizer(self) -> HFTokenizer:
        return HFTokenizer(self.model_dir)

    def layer_types(self) -> list[str]:
        """Each layer's kind in forward order (config.json `layer_types`; a model without it
        is all full attention)."""
        c = _config(self.model_dir)
        return list(c.get("layer_types") or ["full_attention"] * int(c["num_hidden_layers"]))

    def to_spec(self) -> ModelSpec:
        c = _config(self.model_dir)
        types = self.layer_types()
        head = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
        groups = [LayerGroup("gqa", types.count("full_attention"),
                             kv_heads=int(c["num_key_value_heads"]), k_head_dim=head,
                             v_head_dim=head, q_heads=int(c["num_attention_heads"]))]
        n_linear = types.count("linear_attention")
        if n_linear:
            k, v = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
            heads_k, heads_v = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
            groups.append(LayerGroup("linear", n_linear, heads=heads_v, k_head_dim=k,
                                     v_head_dim=v, conv_channels=2 * heads_k * k + heads_v * v,
                                     conv_kernel=int(c["linear_conv_kernel_dim"]),
                                     variant="gdn"))
        dtype, state_dtype = self.dtypes()
        return ModelSpec(self.name, tuple(groups), dtype=dtype, state_dtype=state_dtype,
                         source=f"{self.model_dir}/config.json")
