"""The byte tokenizer's Hugging Face folder (models/hf_tokenizer.py) counts token for token as
prfaas' own ByteTokenizer, loaded the way clients load it (`transformers.AutoTokenizer`,
offline) and with `tokenizers` directly; the same check catches a tokenizer that differs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from prfaas.models.hf_tokenizer import write_byte_tokenizer
from prfaas.models.tokenizer import ByteTokenizer
from prfaas.serve.router.openai_api import chat_prompt

tokenizers = pytest.importorskip("tokenizers")
REF = ByteTokenizer()


def _corpus() -> list[str]:
    """Texts that split differently under any other tokenizer: ASCII words and spaces (BPE
    merges), multi-byte UTF-8 (1-4 bytes), controls, the special tokens' own text, and random
    code points across the whole Unicode range (surrogates excluded: not encodable)."""
    rng = random.Random(0)
    fixed = ["", " ", "hello world", "  two  spaces\n\ttab", "héllo wörld", "日本語のテキスト",
             "emoji 🎉🚀 mixed", "\x00\x01\x7f", "<|bos|>", "a<|eos|>b", "<|user|>\nhi\n",
             "The quick brown fox jumps over the lazy dog. " * 20]
    randoms = []
    for _ in range(300):
        n = rng.randint(1, 60)
        chars = []
        for _ in range(n):
            cp = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0, 0x10FFFF)])
            chars.append(chr(cp if not 0xD800 <= cp <= 0xDFFF else 0x41))
        randoms.append("".join(chars))
    return fixed + randoms


def mismatches(encode: Any, decode: Any, texts: list[str]) -> list[str]:
    """Texts on which `encode` (text -> ids) or `decode` (ids -> text, specials skipped)
    differs from the byte tokenizer."""
    bad = []
    for text in texts:
        ids = REF.encode(text)
        if list(encode(text)) != ids or decode(ids) != REF.decode(ids):
            bad.append(text)
    return bad


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_byte_tokenizer(tmp_path_factory.mktemp("tok"), "prfaas-tiny-kda", 16384)


def test_tokenizers_library_counts_as_the_router(folder: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = _corpus()
    assert mismatches(lambda t: tok.encode(t).ids,
                      lambda ids: tok.decode(ids, skip_special_tokens=True), texts) == []
    assert tok.get_vocab_size() == REF.vocab_size


def test_transformers_offline_counts_as_the_router(folder: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    texts = _corpus()
    assert mismatches(lambda t: tok(t)["input_ids"],
                      lambda ids: tok.decode(ids, skip_special_tokens=True), texts) == []
    assert (tok.bos_token_id, tok.eos_token_id) == (REF.bos_id, REF.eos_id)
    assert tok.model_max_length == 16384
    # the chat template renders as the router does (tokenize=False, then encode: BOS first)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hí"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok(text)["input_ids"] == REF.encode(chat_prompt(messages))


def test_the_check_catches_other_tokenizers(folder: Path, tmp_path: Path) -> None:
    """Negative controls: the same comparison fails for (a) this tokenizer told to split
    special tokens (their text becomes seven byte tokens), (b) one token per ASCII
    character (benchmarks' old ascii tokenizer: no BOS, other ids), (c) a byte-level BPE with
    merges (every real model's kind)."""
    texts = _corpus()
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.encode_special_tokens = True
    bad = mismatches(lambda t: raw.encode(t).ids,
                     lambda ids: raw.decode(ids, skip_special_tokens=True), texts)
    assert bad and all("<|" in t for t in bad)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from prfaas.models.hf_tokenizer import byte_to_unicode

    mapping = byte_to_unicode()
    ascii_vocab = {mapping[b]: i for i, b in enumerate([10, *range(32, 127)])}
    ascii_tok = Tokenizer(models.BPE(vocab=ascii_vocab, merges=[]))
    ascii_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ascii_tok.decoder = decoders.ByteLevel()
    assert len(mismatches(lambda t: ascii_tok.encode(t).ids, ascii_tok.decode, texts)) > 250

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|bos|>", "<|eos|>"]))
    assert len(mismatches(lambda t: [256, *bpe.encode(t).ids], bpe.decode, texts)) > 250


def test_cli_writes_the_served_models_folder(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from prfaas.cli.tokenizer import command

    result = CliRunner().invoke(command, ["--out", str(tmp_path / "tok"), "--hf-cache",
                                          str(tmp_path / "hub")])
    assert result.exit_code == 0, result.output
    assert "--model prfaas-tiny-kda" in result.output
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    assert tok.encode("hi").ids == REF.encode("hi")
    # the hub-cache copy resolves by repo id offline, as a client's snapshot lookup does
    hub = pytest.importorskip("huggingface_hub")
    snap = hub.snapshot_download("prfaas/prfaas-tiny-kda", cache_dir=str(tmp_path / "hub"),
                                 local_files_only=True)
    assert (Path(snap) / "tokenizer.json").read_bytes() == (
        tmp_path / "tok" / "tokenizer.json").read_bytes()
