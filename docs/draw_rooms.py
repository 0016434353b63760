"""Draw the rooms of src/prfaas and the imports between them, by layer: docs/img/rooms.png.

`python docs/draw_rooms.py` (from the project root, matplotlib only). The edges are read from
the source by tests/test_layering.py's `room_edges`, so the picture is what the code imports
today: one arrow per pair of rooms, from the importer to the imported, its width growing with
the number of import statements. Every arrow points down or sideways within a layer.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "rooms.png"
OUT_APP = ROOT / "docs" / "img" / "rooms-app.png"
APP_POS = {  # the application rooms and cli, importers above what they import
    "cli": (5.0, 5.0),
    "experiments": (2.5, 4.0),
    "emulated": (1.0, 3.0), "integrations": (8.5, 3.0),
    "serve.deploy": (5.0, 2.5),
    "bench": (0.5, 1.2), "serve.router": (3.0, 1.2), "serve.worker": (7.0, 1.2),
    "serve": (5.0, 0.0),
}
NAMES = ["core", "models, workload, scenario", "planner, cache, policy",
         "sim, engine, transport, security", "application rooms", "cli"]
ORDER = {  # left to right within a layer: related rooms side by side
    4: ["bench", "experiments", "emulated", "serve.deploy", "serve.router", "serve",
        "serve.worker", "integrations"],
}


def _layering() -> object:
    spec = importlib.util.spec_from_file_location("layering", ROOT / "tests" / "test_layering.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def positions(rank: dict[str, int], rooms: set[str]) -> dict[str, tuple[float, float]]:
    by_layer: dict[int, list[str]] = defaultdict(list)
    for r in sorted(rooms):
        by_layer[rank[r]].append(r)
    pos = {}
    for layer, names in by_layer.items():
        names = [n for n in ORDER.get(layer, []) if n in names] + \
            [n for n in names if n not in ORDER.get(layer, [])]
        width = 14.0
        for i, n in enumerate(names):
            pos[n] = ((i + 0.5) * width / len(names), layer * 2.0)
    return pos


def main() -> int:
    lay = _layering()
    edges = lay.room_edges(ROOT / "src")  # type: ignore[attr-defined]
    rank = lay.RANK  # type: ignore[attr-defined]
    rooms = {r for e in edges for r in e} | set(rank)
    pos = positions(rank, rooms)
    fig, ax = plt.subplots(figsize=(15, 9))
    for layer, name in enumerate(NAMES):
        ax.axhspan(layer * 2 - 0.8, layer * 2 + 0.8, color="0.95" if layer % 2 else "0.9",
                   zorder=0)
        ax.text(-0.3, layer * 2, f"{layer}: {name}", ha="right", va="center", fontsize=9,
                color="0.3")
    for (a, b), where in sorted(edges.items()):
        (x0, y0), (x1, y1) = pos[a], pos[b]
        same = y0 == y1
        ax.add_patch(FancyArrowPatch(
            (x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10,
            connectionstyle="arc3,rad=0.35" if same else "arc3,rad=0.05",
            lw=0.4 + 0.25 * min(len(where), 12) ** 0.5, alpha=0.45,
            color="tab:red" if same else "tab:blue", shrinkA=18, shrinkB=18, zorder=1))
    for r, (x, y) in pos.items():
        label = r.replace("serve.", "serve/")
        ax.add_patch(FancyBboxPatch((x - 0.75, y - 0.3), 1.5, 0.6,
                                    boxstyle="round,pad=0.05", fc="white", ec="0.2", zorder=2))
        ax.text(x, y, label, ha="center", va="center", fontsize=9, zorder=3)
    ax.set_xlim(-4.2, 14.2)
    ax.set_ylim(-1, 11)
    ax.axis("off")
    ax.set_title("prfaas rooms and their imports (blue: to a lower layer, red: within a layer; "
                 "width ~ number of imports)", fontsize=11)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110, bbox_inches="tight", metadata={"Software": None})
    print(f"wrote {OUT.relative_to(ROOT)}: {len(rooms)} rooms, {len(edges)} room-to-room edges")
    draw_app(edges)
    return 0


def draw_app(edges: dict[tuple[str, str], list[str]]) -> None:
    """The programs only: which application room imports which (labels: import count)."""
    fig, ax = plt.subplots(figsize=(10, 7))
    for (a, b), where in sorted(edges.items()):
        if a not in APP_POS or b not in APP_POS:
            continue
        (x0, y0), (x1, y1) = APP_POS[a], APP_POS[b]
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12,
                                     connectionstyle="arc3,rad=0.08", lw=1.0, alpha=0.6,
                                     color="tab:blue", shrinkA=16, shrinkB=16, zorder=5))
        ax.text(x0 + 0.55 * (x1 - x0), y0 + 0.55 * (y1 - y0), str(len(where)), fontsize=7,
                color="tab:blue", ha="center", va="center", zorder=2,
                bbox={"fc": "white", "ec": "none", "pad": 0.5})
    for r, (x, y) in APP_POS.items():
        ax.add_patch(FancyBboxPatch((x - 0.8, y - 0.25), 1.6, 0.5, boxstyle="round,pad=0.05",
                                    fc="white", ec="0.2", zorder=3))
        ax.text(x, y, r.replace("serve.", "serve/"), ha="center", va="center", fontsize=10,
                zorder=4)
    ax.set_xlim(-0.2, 9.8)
    ax.set_ylim(-0.6, 5.6)
    ax.axis("off")
    ax.set_title("The application rooms: serve/router and serve/worker never import each other; "
                 "arrows: importer -> imported (number of imports)", fontsize=10)
    fig.savefig(OUT_APP, dpi=110, bbox_inches="tight", metadata={"Software": None})
    print(f"wrote {OUT_APP.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
