"""Render every benchmark figure in README.md and docs/**/*.md from benchmarks/results/.

One script owns the figures the docs cite; `tests/docs/test_docs_from_data.py` re-renders each
committed doc in memory and fails when one differs from what the JSON says.

How to cite a figure (docs/decisions.md, "Figures come from data", says the same in short)
----------------------------------------------------------------------------------------
An inline figure is the formatted value between two HTML comments, which GitHub does not show
(they work in running text and in table cells, not inside ``` code blocks)::

    <!-- fig sim.json $.case_study_hour.wall_s fmt=.2f -->0.43<!-- /fig --> s

- The first word is the results file, relative to benchmarks/results/ (`live/x.json` works).
- Then an expression over that file: `$` is its root; `.key`, `["key with spaces"]`, `[0]`;
  `[*]` fans out over a list or a dict's values, `[i:j]` over part of a list. `+ - * /`,
  unary `-`, numbers and the functions `min max mean abs len round` combine values; arithmetic
  on a fan-out works element by element, and `min`/`max`/`mean` reduce it. A ratio of two
  figures: `<!-- fig regions_live.json $.budget.runs.budget.regions.near.live.ttft_p90_s /
  $.budget.runs.control_no_budget.regions.near.live.ttft_p90_s fmt=.1f -->3.2<!-- /fig -->x`.
- `fmt=SPEC` (last word, optional) is a Python format spec: `.2f`, `,d`, `,.0f`, `.0%`, `+.1f`.
  Units and "x" stay outside the markers, in the prose.
- `python benchmarks/render_docs.py` rewrites the text between the markers in place;
  `--check` only reports what differs (file:line, committed vs rendered) and exits 1.

A whole generated block (a table, or a code block) sits between `<!-- table NAME -->` and
`<!-- /table -->` on their own lines; NAME is a function registered in doc_tables.TABLES, which
returns the block's markdown from the results files (benchmarks/doc_tables.py).

A figure with no results file behind it is not wrapped: the prose says where it came from
(a command's transcript, a single manual run) instead.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doc_tables import TABLES, Loader

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

FIG_RE = re.compile(r"<!-- fig (?P<spec>.+?) -->(?P<text>.*?)<!-- /fig -->", re.DOTALL)
TABLE_RE = re.compile(
    r"^<!-- table (?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- /table -->$", re.DOTALL | re.MULTILINE
)
FUNCTIONS = ("min", "max", "mean", "abs", "len", "round")


class DocFigureError(Exception):
    """A marker that cannot be rendered: bad syntax, missing file or path, unknown table."""


class Fan(list[Any]):
    """The values a `[*]` fanned out to; arithmetic maps over it, min/max/mean reduce it."""


def load_results(name: str) -> Any:
    path = RESULTS / name
    if not path.is_file():
        raise DocFigureError(f"no results file {name!r} under {RESULTS}")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Figure:
    file: str
    expr: str
    fmt: str

    @classmethod
    def parse(cls, spec: str) -> Figure:
        words = spec.split()
        if len(words) < 2:
            raise DocFigureError(f"fig marker needs a file and an expression: {spec!r}")
        fmt = ""
        if words[-1].startswith("fmt="):
            fmt = words.pop()[4:]
        if not words[0].endswith(".json") or len(words) < 2:
            raise DocFigureError(f"fig marker must start with a .json file: {spec!r}")
        return cls(words[0], " ".join(words[1:]), fmt)

    def render(self, load: Loader) -> str:
        value = evaluate(self.expr, load(self.file))
        if isinstance(value, list | dict):
            raise DocFigureError(f"{self.file} {self.expr} is not one value: {value!r:.80}")
        try:
            return format(value, self.fmt)
        except (ValueError, TypeError) as e:
            raise DocFigureError(f"fmt={self.fmt} does not fit {value!r}: {e}") from None


def evaluate(expr: str, root: Any) -> Any:
    """Evaluate a figure expression over one results document (no Python eval)."""
    source = expr.replace("[*]", "[...]").replace("$", "_root_")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise DocFigureError(f"cannot parse figure expression {expr!r}") from None
    try:
        return _eval(tree.body, root)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        raise DocFigureError(f"{expr!r}: {type(e).__name__} {e}") from None


def _eval(node: ast.expr, root: Any) -> Any:
    if isinstance(node, ast.Name) and node.id == "_root_":
        return root
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str):
        return node.value
    if isinstance(node, ast.Attribute):
        return _index(_eval(node.value, root), node.attr)
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and key.value is Ellipsis:
            return _fan(_eval(node.value, root))
        if isinstance(key, ast.Slice) and key.step is None:
            lo = None if key.lower is None else _eval(key.lower, root)
            hi = None if key.upper is None else _eval(key.upper, root)
            return Fan(_fan(_eval(node.value, root))[lo:hi])
        return _index(_eval(node.value, root), _eval(key, root))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _map(lambda v: -v, _eval(node.operand, root))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op = _BINOPS[type(node.op)]
        return _map2(op, _eval(node.left, root), _eval(node.right, root))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in FUNCTIONS
        and not node.keywords
    ):
        return _call(node.func.id, [_eval(a, root) for a in node.args])
    raise DocFigureError(f"not allowed in a figure expression: {ast.unparse(node)!r}")


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _index(value: Any, key: Any) -> Any:
    if isinstance(value, Fan):
        return Fan(_index(v, key) for v in value)
    if isinstance(value, list) and isinstance(key, int):
        return value[key]
    if isinstance(value, dict) and isinstance(key, str):
        if key not in value:
            raise KeyError(f"{key!r} (have: {', '.join(list(value)[:12])})")
        return value[key]
    raise TypeError(f"cannot index {type(value).__name__} with {key!r}")


def _fan(value: Any) -> Fan:
    if isinstance(value, Fan):
        return Fan(x for v in value for x in _fan(v))
    if isinstance(value, list):
        return Fan(value)
    if isinstance(value, dict):
        return Fan(value.values())
    raise TypeError(f"[*] over a {type(value).__name__}")


def _map(f: Callable[[Any], Any], v: Any) -> Any:
    return Fan(f(x) for x in v) if isinstance(v, Fan) else f(v)


def _map2(f: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    if isinstance(a, Fan) and isinstance(b, Fan):
        if len(a) != len(b):
            raise TypeError(f"fan-outs of {len(a)} and {len(b)} values")
        return Fan(f(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Fan):
        return Fan(f(x, b) for x in a)
    if isinstance(b, Fan):
        return Fan(f(a, y) for y in b)
    return f(a, b)


def _call(name: str, args: list[Any]) -> Any:
    flat = [x for a in args for x in (a if isinstance(a, Fan) else [a])]
    if name == "min":
        return min(flat)
    if name == "max":
        return max(flat)
    if name == "mean":
        return sum(flat) / len(flat)
    if name == "abs":
        return _map(abs, args[0])
    if name == "len":
        return len(args[0])
    return round(args[0], *args[1:])


@dataclass(frozen=True)
class Mismatch:
    doc: str
    line: int
    what: str
    committed: str
    rendered: str

    def __str__(self) -> str:
        return (
            f"{self.doc}:{self.line}: {self.what}: committed {self.committed!r}, "
            f"data says {self.rendered!r}"
        )


def render(
    text: str, load: Loader = load_results, doc: str = "<doc>"
) -> tuple[str, list[Mismatch]]:
    """The doc with every marker re-rendered, and where it differed from the committed text.

    Markers inside code (``` fences, `spans`) are text, not figures: GitHub shows them there.
    """
    mismatches: list[Mismatch] = []

    def block(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in TABLES:
            raise DocFigureError(f"{doc}:{_line(text, m.start())}: no table function {name!r}")
        new = TABLES[name](load).rstrip("\n") + "\n"
        if new != m["body"]:
            pairs = zip([*m["body"].splitlines(), ""], [*new.splitlines(), ""], strict=False)
            first = next(((a, b) for a, b in pairs if a != b), (m["body"], new))
            mismatches.append(Mismatch(doc, _line(text, m.start()), f"table {name}", *first))
        return f"<!-- table {name} -->\n{new}<!-- /table -->"

    tabled = TABLE_RE.sub(block, text)
    code = _code_spans(tabled)
    out: list[str] = []
    pos = 0
    for m in FIG_RE.finditer(tabled):
        if any(a <= m.start() < b for a, b in code):
            continue
        where = f"{doc}:{_line(tabled, m.start())}"
        if "<!--" in m["text"]:
            raise DocFigureError(f"{where}: fig marker without its <!-- /fig -->")
        try:
            new = Figure.parse(m["spec"]).render(load)
        except DocFigureError as e:
            raise DocFigureError(f"{where}: {e}") from None
        if new != m["text"]:
            mismatches.append(Mismatch(doc, _line(tabled, m.start()), m["spec"], m["text"], new))
        out += [tabled[pos : m.start()], f"<!-- fig {m['spec']} -->{new}<!-- /fig -->"]
        pos = m.end()
    out.append(tabled[pos:])
    return "".join(out), mismatches


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _code_spans(text: str) -> list[tuple[int, int]]:
    fences = [(m.start(), m.end()) for m in re.finditer(r"^```.*?^```", text, re.DOTALL | re.M)]
    spans = [
        (m.start(), m.end())
        for m in re.finditer(r"`(?:[^`\n]|\n(?![ \t]*\n))+`", text)  # spans may wrap
        if not any(a <= m.start() < b for a, b in fences)
    ]
    return fences + spans


def count_markers(text: str) -> int:
    code = _code_spans(text)
    figs = [m for m in FIG_RE.finditer(text) if not any(a <= m.start() < b for a, b in code)]
    return len(figs) + len(TABLE_RE.findall(text))


def docs(repo: Path = REPO) -> Iterator[Path]:
    yield repo / "README.md"
    yield from sorted((repo / "docs").rglob("*.md"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="report differences, write nothing")
    ap.add_argument("paths", nargs="*", type=Path, help="docs (default README.md, docs/**/*.md)")
    args = ap.parse_args(argv)
    bad = 0
    for path in args.paths or list(docs()):
        text = path.read_text()
        try:
            new, mismatches = render(text, doc=str(path))
        except DocFigureError as e:
            print(e, file=sys.stderr)
            return 2
        for m in mismatches:
            print(m)
        bad += len(mismatches)
        if mismatches and not args.check:
            path.write_text(new)
    if args.check and bad:
        print(f"{bad} figure(s) differ from benchmarks/results/; run benchmarks/render_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
