"""Tiny real-architecture Hugging Face models built locally: no download, deterministic.

`build_model(arch, out_dir, seed, weights)` writes a transformers config, the weights
(safetensors) and a byte-level BPE tokenizer, so vLLM loads the directory like any checkpoint.
`weights="trained"` (the default): the shipped weights, trained on the Python standard library's
docstrings (engine/weights.py, benchmarks/train_tiny_models.py), with the tokenizer trained on
the same text (data/weights/vllm-tokenizer.json). `weights="seed"`: seeded random weights and a
tokenizer trained here on generated text. `llama` is a plain GQA transformer (bit-exact
P/D tests); `qwen3_next` is the hybrid (3 Gated DeltaNet : 1 full-attention layers, MoE) whose
recurrent state must cross with the KV. Needs the `vllm` extra (transformers, tokenizers).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.engine.weights import DATA, trained_path
from prfaas.engine.weights import read as read_weights

ARCHS = ("llama", "qwen3_next")
VOCAB_SIZE = 1024  # model rows; the tokenizer uses fewer (TOKENIZER_VOCAB)
TOKENIZER_VOCAB = 1000
SPECIAL = {"bos": ("<s>", 0), "eos": ("</s>", 1), "pad": ("<pad>", 2)}
_TEXT = ("the prefill cluster ships kv cache over a long link while decode nodes stream tokens "
         "to users each layer of attention adds keys and values hybrid models keep a small "
         "recurrent state router picks short requests locally and long ones remotely bandwidth "
         "latency queue throughput token block prefix cache hit miss model serve")
_WORDS = _TEXT.split(" ")
_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192,
    bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
_EXTRA: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3_next": dict(
        layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        partial_rotary_factor=0.25, decoder_sparse_step=1, mlp_only_layers=[]),
}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


WEIGHTS = ("trained", "seed")


def corpus(seed: int, num_sentences: int = 2000) -> list[str]:
    """Generated sentences the tokenizer is trained on (seeded, so the vocabulary is fixed)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "."
            for _ in range(num_sentences)]


def train_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` of TOKENIZER_VOCAB tokens trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [name for name, _ in sorted(SPECIAL.values(), key=lambda s: s[1])]
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def build_tokenizer(out_dir: Path, seed: int, weights: str = "seed") -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if weights == "trained":
        tok = Tokenizer.from_file(str(DATA / "vllm-tokenizer.json"))
    else:
        tok = train_tokenizer(corpus(seed))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL["bos"][0],
                                   eos_token=SPECIAL["eos"][0], pad_token=SPECIAL["pad"][0])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def hf_config(arch: str) -> Any:
    """The transformers config of the tiny `arch`."""
    if arch not in ARCHS:
        raise ConfigError("--arch", arch, f"unknown; known: {', '.join(ARCHS)}")
    from transformers import AutoConfig

    return AutoConfig.for_model(arch, **_COMMON, **_EXTRA[arch])


def identity(arch: str, seed: int, weights: str) -> dict[str, Any]:
    """What a built directory must record to be reused: the arch and its weights' origin (the
    shipped file's digest, so a retrained model replaces an older build)."""
    if weights not in WEIGHTS:
        raise ConfigError("vllm.model.weights", weights, f"one of {', '.join(WEIGHTS)}")
    if weights == "seed":
        return {"arch": arch, "seed": seed}
    data = trained_path(f"vllm-{arch}").read_bytes()
    return {"arch": arch, "weights": "trained", "sha256": hashlib.sha256(data).hexdigest()}


def build_model(arch: str, out_dir: str | Path, seed: int = 0, weights: str = "trained") -> Path:
    """Write config + weights + tokenizer to `out_dir`; returns it."""
    ident = identity(arch, seed, weights)
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch))
    if weights == "trained":
        model.load_state_dict(read_weights(trained_path(f"vllm-{arch}")), strict=True)
    model.save_pretrained(str(out))
    build_tokenizer(out, seed, weights)
    (out / "prfaas_model.json").write_text(json.dumps(ident) + "\n")
    return out


def is_built(model_dir: str | Path, arch: str | None = None, seed: int = 0,
             weights: str = "trained") -> bool:
    """The directory holds a built model (of `arch`, seed and weights, when `arch` is given)."""
    d = Path(model_dir)
    done = (d / "prfaas_model.json").is_file() and (d / "config.json").is_file() and (
        d / "tokenizer.json").is_file()
    if not done or arch is None:
        return done
    recorded = json.loads((d / "prfaas_model.json").read_text())
    return bool(recorded == identity(arch, seed, weights))


def ensure_model(arch: str, model_dir: str | Path, seed: int = 0,
                 weights: str = "trained") -> Path:
    """Build the model once: a directory that already holds this very model is left as it is
    (one built from other weights, e.g. before a retraining, is rebuilt)."""
    if is_built(model_dir, arch, seed, weights):
        return Path(model_dir)
    return build_model(arch, model_dir, seed, weights)
