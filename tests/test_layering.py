"""The package's layering, read from the source (AST, every import, module level or inside a
function): no room imports a room of a higher layer, no two rooms import each other through
any chain (a cycle of rooms), and the router and worker programs import nothing of each other.

Layers (docs/architecture.md, "The rooms"): core < models, workload, scenario < planner, cache,
policy < sim, engine, transport, security < the application rooms (serve: the programs' shared
contract; serve/router, serve/worker, serve/deploy; the engine backends emulated and
integrations; experiments; bench) < cli. A new room must be placed here, or the test fails.

`python tests/test_layering.py [SRC]` prints the violations of a tree (e.g. an older checkout).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
RANK = {"core": 0,
        "models": 1, "workload": 1, "scenario": 1,
        "planner": 2, "cache": 2, "policy": 2,
        "sim": 3, "engine": 3, "transport": 3, "security": 3,
        "serve": 4, "serve.router": 4, "serve.worker": 4, "serve.deploy": 4,
        "emulated": 4, "integrations": 4, "experiments": 4, "bench": 4,
        "cli": 5}
PROGRAMS = ("serve.router", "serve.worker", "serve.deploy")  # rooms inside serve/
APART = {("serve.router", "serve.worker"), ("serve.worker", "serve.router")}
OUTSIDE = {"__init__", "__main__", "data"}  # the package root, the entry point, data files


def room_of(module: str) -> str | None:
    """`prfaas.serve.router.dispatch` -> `serve.router`; `prfaas.scenario` -> `scenario`."""
    parts = module.split(".")
    if parts[0] != "prfaas" or len(parts) < 2 or parts[1] in OUTSIDE:
        return None
    if len(parts) >= 3 and ".".join(parts[1:3]) in PROGRAMS:
        return ".".join(parts[1:3])
    return parts[1]


def module_of(path: Path, src: Path) -> str:
    return ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import in the tree, relative ones resolved."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            # `from prfaas.serve import router` imports the module prfaas.serve.router
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def room_edges(src: Path) -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> where ("path:line"), for every import between two rooms."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted((src / "prfaas").rglob("*.py")):
        module = module_of(path, src)
        here = room_of(module)
        if here is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, name in imported(tree, module, path.name == "__init__.py"):
            there = room_of(name)
            where = f"{path.relative_to(src)}:{line}"
            if there is not None and there != here and where not in edges[(here, there)]:
                edges[(here, there)].append(where)  # once per import statement
    return edges


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The rooms' strongly connected components of more than one room (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(graph) | {b for bs in graph.values() for b in bs}):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(src: Path) -> list[str]:
    edges = room_edges(src)
    rooms = {r for edge in edges for r in edge}
    out = [f"room {r} has no layer in RANK" for r in sorted(rooms - set(RANK))]
    for (a, b), where in sorted(edges.items()):
        if RANK.get(b, 99) > RANK.get(a, 99):
            out += [f"{w} {a} -> {b} (upward)" for w in where]
        if (a, b) in APART:
            out += [f"{w} {a} -> {b} (router and worker are separate programs)" for w in where]
    out += [f"cycle {' <-> '.join(c)}: " + "; ".join(
        f"{a} -> {b} at {where[0]}" for (a, b), where in sorted(edges.items())
        if a in c and b in c) for c in cycles(edges)]
    return out


def test_the_package_keeps_its_layers() -> None:
    assert violations(SRC) == []


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(module_of(p, SRC)) for p in (SRC / "prfaas").rglob("*.py")} - {None}
    assert rooms <= set(RANK), sorted(rooms - set(RANK))  # type: ignore[operator]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "prfaas" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {"core/errors.py": "X = 1\n",
         "models/spec.py": "from prfaas.core.errors import X\n",
         "serve/topology.py": "from prfaas.models.spec import X\n",
         "serve/router/dispatch.py": "from prfaas.serve.topology import X\n",
         "serve/worker/batcher.py": "from ..topology import X\n",
         "serve/deploy/proc.py": ("def f():\n    from prfaas.serve.router.dispatch import X\n"
                                  "    from prfaas.serve.worker import batcher\n"),
         "cli/serve.py": "import prfaas.serve.deploy.proc\n"}


def test_a_clean_synthetic_tree_passes(tmp_path: Path) -> None:
    assert violations(_tree(tmp_path, CLEAN)) == []


@pytest.mark.parametrize(("extra", "expected"), [
    # an upward import hidden in a function (core -> models)
    ({"core/units.py": "def f():\n    from prfaas.models.spec import X\n"},
     "prfaas/core/units.py:2 core -> models (upward)"),
    # a relative upward import (models -> planner, `from ..planner import search`)
    ({"models/kv.py": "from ..planner import search\n", "planner/search.py": "Y = 2\n"},
     "prfaas/models/kv.py:1 models -> planner (upward)"),
    # the router program reaching into the worker program
    ({"serve/router/cluster.py": "from prfaas.serve.worker.batcher import X\n"},
     "prfaas/serve/router/cluster.py:1 serve.router -> serve.worker (router and worker "
     "are separate programs)"),
    # a three-room cycle on one layer: router -> emulated -> experiments -> router
    ({"serve/router/plan.py": "import prfaas.emulated.backend\n",
      "emulated/backend.py": "from prfaas.experiments import live\n",
      "experiments/live.py": "from prfaas.serve.router import plan\n"},
     "cycle emulated <-> experiments <-> serve.router"),
    # a room nobody placed
    ({"newroom/x.py": "from prfaas.core.errors import X\n"}, "room newroom has no layer"),
])
def test_a_violation_is_reported(tmp_path: Path, extra: dict[str, str], expected: str) -> None:
    """Negative controls: each breach, added to the clean tree, is named (and only then)."""
    found = violations(_tree(tmp_path, {**CLEAN, **extra}))
    assert any(v.startswith(expected) for v in found), found


if __name__ == "__main__":
    found = violations(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    print("\n".join(found))
    print(f"{len(found)} layering violations")
    sys.exit(1 if found else 0)
