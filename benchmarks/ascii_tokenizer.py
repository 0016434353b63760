"""Write a Hugging Face tokenizer that counts tokens as the router does, for vLLM's benchmark
client (`vllm bench serve` needs one to make its random prompts and count tokens).

The router's tokenizer is one token per byte. This one has one token per printable ASCII
character (and newline), so a random prompt of N tokens is N bytes of ASCII text and N router
tokens (+ BOS). Run with the Python of the environment that has `vllm` (it brings
`tokenizers` and `transformers`): `python benchmarks/ascii_tokenizer.py OUT_DIR`.
"""

from __future__ import annotations

import argparse


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def main(out_dir: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    mapping = bytes_to_unicode()
    vocab = {mapping[b]: i for i, b in enumerate([10, *range(32, 127)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|eos|>")
    fast.save_pretrained(out_dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="folder to write the tokenizer into")
    main(parser.parse_args().out_dir)
