"""The byte tokenizer (models/tokenizer.py) as a Hugging Face tokenizer folder, for clients.

Benchmark clients (guidellm, aiperf, `vllm bench serve`) count and build prompts with a
tokenizer they load through `transformers.AutoTokenizer`; pointed at this folder they count
exactly as prfaas' router and native workers do: id = byte value (0..255), `<|bos|>` = 256
first, `<|eos|>` = 257. The folder is written here as plain JSON, with no dependency:

- tokenizer.json: a BPE model over the 256 byte symbols of a ByteLevel pre-tokenizer (GPT-2's
  byte -> character map, no regex split) with no merges, so every byte is one token and its id
  is the byte's value; a template post-processor puts BOS first (as `ByteTokenizer.encode`);
- tokenizer_config.json: BOS and EOS (their text in a prompt is the special token, for the
  router too), and a chat template that renders messages as the router does
  (router/openai_api.py `chat_prompt`);
- special_tokens_map.json.

`tests/models/test_hf_tokenizer.py` checks it token for token against `ByteTokenizer` with
`tokenizers` and `transformers`, and that the same check catches a different tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from prfaas.models.tokenizer import BOS_TEXT as BOS
from prfaas.models.tokenizer import EOS_TEXT as EOS
from prfaas.models.tokenizer import ByteTokenizer

# the router's chat rendering (router/openai_api.py chat_prompt) for string contents
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer applies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def _special(content: str) -> dict[str, Any]:
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _added(token_id: int, content: str) -> dict[str, Any]:
    return {"id": token_id, **_special(content)}


def tokenizer_json() -> dict[str, Any]:
    """tokenizer.json (the `tokenizers` library's serialization) of the byte tokenizer."""
    tok = ByteTokenizer()
    mapping = byte_to_unicode()
    vocab: dict[str, int] = {mapping[b]: b for b in range(256)}
    vocab[BOS], vocab[EOS] = tok.bos_id, tok.eos_id
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(tok.bos_id, BOS), _added(tok.eos_id, EOS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [tok.bos_id], "tokens": [BOS]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config(model_name: str, max_tokens: int) -> dict[str, Any]:
    tok = ByteTokenizer()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "name_or_path": model_name,
        "model_max_length": max_tokens,
        "bos_token": BOS, "eos_token": EOS,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(tok.bos_id): _special(BOS), str(tok.eos_id): _special(EOS)},
        "chat_template": CHAT_TEMPLATE,
    }


def write_byte_tokenizer(out_dir: str | Path, model_name: str, max_tokens: int) -> Path:
    """Write the folder; returns it. `model_name` is what the router serves (the clients'
    `--model`), `max_tokens` its context."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"tokenizer.json": tokenizer_json(),
             "tokenizer_config.json": tokenizer_config(model_name, max_tokens),
             "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS}}
    for name, body in files.items():
        (out / name).write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n",
                                encoding="utf-8")
    return out


def install_in_hf_cache(folder: str | Path, cache_dir: str | Path, repo_id: str) -> Path:
    """Lay `folder`'s files out as repo `repo_id` in a Hugging Face hub cache (HF_HUB_CACHE
    layout: models--ORG--NAME/refs/main -> snapshots/REV/), for clients that look a tokenizer
    up by repo id even offline (aiperf 0.13.0's trace-replay workers do, whatever path they
    are given). The revision is the files' SHA-256, so the same files give the same entry;
    returns the snapshot folder."""
    src = Path(folder)
    digest = hashlib.sha256()
    for name in FILES:
        if (src / name).is_file():
            digest.update(name.encode() + b"\0" + (src / name).read_bytes())
    rev = digest.hexdigest()[:40]
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, snap / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return snap
