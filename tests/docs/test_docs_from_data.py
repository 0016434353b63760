"""Every figure the docs wrap in a marker is what benchmarks/results/ says (render_docs.py).

Each committed doc is re-rendered in memory from the committed JSON and must come out unchanged.
The negative controls change one figure in a doc, or one value in a results file, and the same
comparison must then fail.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_renderer() -> Any:
    sys.path.insert(0, str(REPO / "benchmarks"))  # as when run as a script: doc_tables beside it
    spec = importlib.util.spec_from_file_location("render_docs", REPO / "benchmarks/render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_docs"] = module
    spec.loader.exec_module(module)
    return module


rd = _load_renderer()
DOCS = list(rd.docs(REPO))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_doc_agrees_with_its_results(path: Path) -> None:
    text = path.read_text()
    rendered, mismatches = rd.render(text, doc=str(path.relative_to(REPO)))
    assert not mismatches, "\n".join(map(str, mismatches)) + "\nrun benchmarks/render_docs.py"
    assert rendered == text


def test_the_readme_cites_its_figures_through_markers() -> None:
    # A conversion that lost its markers would pass the test above vacuously.
    assert rd.count_markers((REPO / "README.md").read_text()) >= 50


def _first_figure(text: str) -> re.Match[str]:
    code = rd._code_spans(text)
    return next(m for m in rd.FIG_RE.finditer(text) if not any(a <= m.start() < b for a, b in code))


def test_a_changed_figure_in_a_doc_fails() -> None:
    text = (REPO / "README.md").read_text()
    m = _first_figure(text)
    wrong = m["text"] + "1"
    edited = text[: m.start("text")] + wrong + text[m.end("text") :]
    _, mismatches = rd.render(edited, doc="README.md")
    assert [(x.committed, x.rendered) for x in mismatches] == [(wrong, m["text"])]


def _perturbed(x: Any, up: bool = True) -> Any:
    if isinstance(x, bool):
        return not x  # a verdict (sustained or not): counted by arithmetic on True/False
    if x is None or isinstance(x, dict | list):
        raise AssertionError(f"not a leaf: {x!r:.60}")
    if isinstance(x, int):
        return x * 2 + 1 if up else x // 2 - 1
    if isinstance(x, float):
        return x * 1.5 + 0.37 if up else x * 0.5 - 0.37
    return x + "~"


class _ReadDict(dict[str, Any]):
    """A results document that records the paths of the leaves an expression reads."""

    def __init__(self, data: dict[str, Any], path: tuple[Any, ...], reads: set[tuple[Any, ...]]):
        super().__init__({k: _recording(v, (*path, k), reads) for k, v in data.items()})
        self.path, self.reads = path, reads

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if not isinstance(value, dict | list):
            self.reads.add((*self.path, key))
        return value

    def values(self) -> Any:
        return [self[k] for k in self]


class _ReadList(list[Any]):
    def __init__(self, data: list[Any], path: tuple[Any, ...], reads: set[tuple[Any, ...]]):
        super().__init__(_recording(v, (*path, i), reads) for i, v in enumerate(data))
        self.path, self.reads = path, reads

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        if isinstance(key, int) and not isinstance(value, dict | list):
            self.reads.add((*self.path, key % super().__len__()))
        return value

    def __iter__(self) -> Any:
        return (self[i] for i in range(super().__len__()))

    def __len__(self) -> int:
        self.reads.add((*self.path, LENGTH))
        return super().__len__()


LENGTH = "<length>"  # a read of a list's length; changed by appending a copy of its last item


def _recording(x: Any, path: tuple[Any, ...], reads: set[tuple[Any, ...]]) -> Any:
    if isinstance(x, dict):
        return _ReadDict(x, path, reads)
    if isinstance(x, list):
        return _ReadList(x, path, reads)
    return x


def _leaves_read(expr: str, doc: Any) -> set[tuple[Any, ...]]:
    reads: set[tuple[Any, ...]] = set()
    rd.evaluate(expr, _recording(doc, (), reads))
    return reads


def _with_leaf_changed(doc: Any, path: tuple[Any, ...], up: bool = True) -> Any:
    changed = copy.deepcopy(doc)
    node = changed
    for key in path[:-1]:
        node = node[key]
    if path[-1] == LENGTH:
        node.append(copy.deepcopy(node[-1])) if up else node.pop()
    else:
        node[path[-1]] = _perturbed(node[path[-1]], up)
    return changed


def test_a_changed_value_in_a_results_file_fails() -> None:
    text = (REPO / "README.md").read_text()
    fig = rd.Figure.parse(_first_figure(text)["spec"])
    original = rd.load_results(fig.file)
    (leaf,) = _leaves_read(fig.expr, original)  # the README's first figure is one value
    changed = _with_leaf_changed(original, leaf)

    def load(name: str) -> Any:
        return changed if name == fig.file else rd.load_results(name)

    _, mismatches = rd.render(text, load=load, doc="README.md")
    assert mismatches, f"changing {fig.file} {leaf} went unnoticed"
    assert {m.what.split()[0] for m in mismatches} == {fig.file}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_depends_on_its_data(path: Path) -> None:
    # A marker around a constant (`f.json 3.24`) would pass the agreement test and mean
    # nothing: for every figure, changing one of the values it reads must change its text.
    text = path.read_text()
    code = rd._code_spans(text)
    for m in rd.FIG_RE.finditer(text):
        if any(a <= m.start() < b for a, b in code):
            continue
        fig = rd.Figure.parse(m["spec"])
        doc = rd.load_results(fig.file)
        leaves = _leaves_read(fig.expr, doc)
        assert leaves, f"{path.name}: {m['spec']} reads nothing from {fig.file}"
        # up and down: a minimum shared by two values moves only when one of them goes down
        moved = (_moves(fig, _with_leaf_changed(doc, leaf, up), m["text"])
                 for leaf in leaves for up in (True, False))
        assert any(moved), (
            f"{path.name}: {m['spec']} does not move with any value it reads"
        )


def _moves(fig: Any, doc: Any, text: str) -> bool:
    try:
        return bool(fig.render(lambda name: doc) != text)
    except rd.DocFigureError:
        return True  # the changed value no longer fits the format: it was read


def test_a_whole_table_is_checked_line_by_line() -> None:
    rd.TABLES["_test_table"] = lambda load: f"| a |\n|---|\n| {load('x.json')['v']} |\n"
    try:
        doc = "text\n<!-- table _test_table -->\n| a |\n|---|\n| 1 |\n<!-- /table -->\nend\n"
        out, bad = rd.render(doc, load=lambda name: {"v": 1})
        assert (out, bad) == (doc, [])
        out, bad = rd.render(doc, load=lambda name: {"v": 2})
        assert [(m.committed, m.rendered) for m in bad] == [("| 1 |", "| 2 |")]
        assert "| 2 |" in out
    finally:
        del rd.TABLES["_test_table"]


def test_expressions() -> None:
    doc = {"runs": [{"a": 2.0, "b": 1.0}, {"a": 9.0, "b": 3.0}], "k v": {"x": 7}}
    assert rd.evaluate("$.runs[1].a / $.runs[1].b", doc) == 3.0
    assert rd.evaluate("max($.runs[*].a / $.runs[*].b)", doc) == 3.0
    assert rd.evaluate("min($.runs[*].a) - 1", doc) == 1.0
    assert rd.evaluate('$["k v"].x * 2', doc) == 14
    assert rd.evaluate("mean($.runs[*].b)", doc) == 2.0
    assert rd.evaluate("len($.runs)", doc) == 2
    assert _leaves_read("len($.runs)", doc) == {("runs", LENGTH)}
    assert rd.Figure.parse("f.json $.runs[0].a * 100 fmt=.1f").render(lambda n: doc) == "200.0"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("f.json $.runs[5].a", "IndexError"),
        ("f.json $.nope", "'nope'"),
        ("f.json __import__('os')", "not allowed"),
        ("f.json $.runs[0].a fmt=d", "fmt=d"),
        ("f.json $.runs", "not one value"),
        ("f.json", "needs a file and an expression"),
    ],
)
def test_bad_markers_are_one_clear_error(spec: str, message: str) -> None:
    doc = {"runs": [{"a": 2.5}]}
    with pytest.raises(rd.DocFigureError, match=re.escape(message)):
        rd.render(f"x <!-- fig {spec} -->1<!-- /fig -->", load=lambda n: doc)


def test_markers_in_code_are_text_and_a_missing_close_is_an_error() -> None:
    def load(n: str) -> Any:
        return {"a": 1}

    marker = "<!-- fig f.json $.a -->9<!-- /fig -->"
    shown = f"`{marker}`\n```\n{marker}\n```\n"
    assert rd.render(shown, load=load) == (shown, [])
    with pytest.raises(rd.DocFigureError, match="without its"):
        rd.render("<!-- fig f.json $.a -->1 <!-- fig f.json $.a -->1<!-- /fig -->", load=load)


def test_every_results_file_parses() -> None:
    for path in sorted((REPO / "benchmarks/results").rglob("*.json")):
        json.loads(path.read_text())


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_figure_hides_in_code(path: Path) -> None:
    # A marker inside a code span or block is shown as text and never checked: only the
    # how-to in decisions.md may show one.
    text = path.read_text()
    code = rd._code_spans(text)
    hidden = [m for m in rd.FIG_RE.finditer(text) if any(a <= m.start() < b for a, b in code)]
    assert path.name == "decisions.md" or not hidden, f"{path.name}: {hidden[0].group(0)[:80]}"
