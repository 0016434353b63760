"""Text that ships with Python: the standard library's docstrings, extracted deterministically.

The shipped tiny models (engine presets `tiny` / `mimo_like`, the vLLM test models) were
trained on it (benchmarks/train_tiny_models.py), and the quality benchmarks take their prompts
from its held-out part: every module, class and function docstring of the stdlib's `.py` files
(tests and site-packages left out), in sorted file order then source order, each followed by a
blank line. A file belongs to the held-out split when its crc32 is 0 mod HELD_OUT_EVERY, so the
split depends on the file's path only. The text depends on the Python patch version: `digest`
names it, and the training record keeps the digest it was trained on.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

HELD_OUT_EVERY = 16  # one file in 16 (by crc32 of its relative path) is held out
_SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "__phello__"}
SEPARATOR = "\n\n"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py")
                  if not _SKIP_PARTS & set(p.relative_to(root).parts))


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a few stdlib files are templates, not Python
        return []
    nodes = [tree, *(n for n in ast.walk(tree)
                     if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    out = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc and len(doc) >= 16:
            out.append(doc)
    return out


def held_out(relative_path: str) -> bool:
    return zlib.crc32(relative_path.encode()) % HELD_OUT_EVERY == 0


@lru_cache(maxsize=2)
def split(stdlib: str | None = None) -> tuple[str, str]:
    """(training text, held-out text) of the stdlib at `stdlib` (default: this Python's)."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    test: list[str] = []
    for path in _files(root):
        docs = _docstrings(path.read_text(encoding="utf-8", errors="replace"))
        (test if held_out(path.relative_to(root).as_posix()) else train).extend(docs)
    return SEPARATOR.join(train) + SEPARATOR, SEPARATOR.join(test) + SEPARATOR


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_paragraphs(encode: Callable[[str], list[int]], text: str) -> list[int]:
    """`text` as a tokenizer saw it in training: paragraph by paragraph, each followed by the
    separator's tokens (a BPE merges nothing across paragraphs)."""
    sep = encode(SEPARATOR)
    out: list[int] = []
    for paragraph in text.split(SEPARATOR):
        if paragraph:
            out += encode(paragraph) + sep
    return out


def heldout_windows(encode: Callable[[str], list[int]], lengths: Sequence[int],
                    seed: int) -> list[list[int]]:
    """One window of held-out tokens per length, at offsets drawn from a numpy Generator
    seeded with `seed` (prompts the models never trained on, of exact token lengths)."""
    tokens = encode_paragraphs(encode, split()[1])
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        if n >= len(tokens):
            raise ValueError(f"a {n}-token window: the held-out text has {len(tokens)} tokens")
        at = int(rng.integers(0, len(tokens) - n))
        out.append(tokens[at:at + n])
    return out
