"""Write a Hugging Face tokenizer that counts tokens as the router does, for vLLM's benchmark
client (`vllm bench serve` needs one to make its random prompts and count tokens).

The router's tokenizer is one token per byte. This one has one token per printable ASCII
character (and newline), so a random prompt of N tokens is N bytes of ASCII text and N router
tokens (+ BOS). Run with the Python of the environment that has `vllm` (it brings
`tokenizers` and `transformers`): `python benchmarks/ascii_tokenizer.py OUT_DIR`.
"""

from __future__ import annotations

import argparse

from prfaas.models.hf_tokenizer import byte_to_unicode


def main(out_dir: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    mapping = byte_to_unicode()
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
