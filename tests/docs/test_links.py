"""Every link and file path the README and the docs give a reader leads somewhere.

Two kinds of reference are checked in README.md, benchmarks/README.md and every .md under docs/:
- markdown links `[text](target)` that are not URLs: the file exists, relative to the page, and
  a `#fragment` names one of the target page's headings (GitHub's anchor for it);
- repository paths written out in the text (`docs/vllm.md`, `benchmarks/bench_sim.py`,
  `benchmarks/results/sim.json`, `src/prfaas/...`): the file or folder exists, relative to the
  repository root. A path behind a commit (`git show 1a2b3c4:benchmarks/x.py`) names history,
  a pattern (`benchmarks/results/live/*.json`) many files, and one after `--out ` a file a
  command writes: those are not checked.
The negative controls feed the same checks a page with a broken link, anchor and path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "benchmarks" / "README.md",
         *sorted((REPO / "docs").rglob("*.md"))]

LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PATH_RE = re.compile(
    r"(?<![\w./:-])(?<!--out )((?:docs|benchmarks|src/prfaas|tests|deploy|topologies|scenarios)"
    r"/[\w./*{},-]*[\w/*}])")
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
FENCE_RE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, spaces to hyphens, only
    letters, digits, hyphens and underscores kept."""
    text = re.sub(r"<!--.*?-->", "", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE_RE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING_RE.finditer(text):
        a = anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def broken_links(page: Path, text: str) -> list[str]:
    bad = []
    for m in LINK_RE.finditer(FENCE_RE.sub("", text)):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{fragment} in {dest.name}")
    return bad


def missing_paths(text: str, repo: Path = REPO) -> list[str]:
    bad = []
    for m in PATH_RE.finditer(text):
        path = m.group(1).rstrip(".")
        if any(c in path for c in "*{}"):  # a pattern, not one file
            continue
        if not (repo / path).exists():
            bad.append(path)
    return sorted(set(bad))


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_links_resolve(page: Path) -> None:
    bad = broken_links(page, page.read_text())
    assert not bad, f"{_id(page)}: " + "; ".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_repository_paths_exist(page: Path) -> None:
    bad = missing_paths(page.read_text())
    assert not bad, f"{_id(page)} names files that are not in the repository: {bad}"


def test_the_pages_are_found() -> None:
    # A glob that found nothing would make every test above pass vacuously.
    assert len(PAGES) >= 10 and all(p.is_file() for p in PAGES)


def test_a_broken_link_anchor_or_path_is_reported() -> None:
    page = REPO / "README.md"
    first = HEADING_RE.search(page.read_text())
    assert first is not None
    heading = anchor(first.group(1))
    good = f"[a](README.md#{heading}) [b](docs) ![c](docs/img/rooms.png) [d](https://x.y/z)"
    assert broken_links(page, good) == []
    bad = "[a](docs/nope.md) [b](README.md#no-such-heading)\n```\n[c](in/a/fence.md)\n```\n"
    assert broken_links(page, bad) == [
        "docs/nope.md: no such file",
        "README.md#no-such-heading: no heading with anchor #no-such-heading in README.md"]
    text = ("see `benchmarks/run_all.py`, docs/img/rooms.png and benchmarks/nope.py; "
            "git show 1a2b3c4:benchmarks/gone.py; benchmarks/*.py, benchmarks/results/x*.json; "
            "--out docs/new.md; src/prfaas/nope/.")
    assert missing_paths(text) == ["benchmarks/nope.py", "src/prfaas/nope/"]


def test_github_anchors() -> None:
    assert anchor("The planner: throughput model, grid search, egress") == \
        "the-planner-throughput-model-grid-search-egress"
    assert anchor("`prfaas plan`: throughput model") == "prfaas-plan-throughput-model"
    assert anchor("Fairness: one region at 3x its planned rate") == \
        "fairness-one-region-at-3x-its-planned-rate"
