"""The only ways a test may skip: a missing privilege, tool, extra or CPU, named as a feature.

Each feature's check reads the machine (capabilities, PATH, installed distributions, CPUs) and
runs nothing of prfaas: a skip can never be decided by the code under test failing. A test asks
for features with `@needs("netns")` (or `pytestmark = needs(...)`), a fixture with
`check("ray")`, a module that imports an extra at its top with
`import_for("k8s", "helm_python.chart")`.

`PRFAAS_REQUIRE=netns,vllm,...` (the Makefile sets it for `make test`: the features this machine
kind must have) turns the skip of a required feature into a failure, one line saying which
feature and why; with it set, a skip that came from anywhere else (a bare `pytest.skip`, an
`importorskip`) fails too (tests/conftest.py, `pytest_runtest_makereport`). Unset, missing
features skip with their reason (`-rs` lists them).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

CAP_NET_ADMIN = 12  # linux/capability.h
CAP_SYS_ADMIN = 21  # `ip netns add` mounts the namespace under /run/netns
PREFIX = "[needs "  # every skip this module makes starts with it (conftest tells them apart)


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _netns() -> str | None:
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH (iproute2)"
    caps = _effective_caps()
    lacking = [n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not caps >> bit & 1]
    return f"no {' and '.join(lacking)} (network namespaces, veth, tc)" if lacking else None


def _modules(extra: str, *names: str) -> Callable[[], str | None]:
    def check() -> str | None:
        absent = [n for n in names if importlib.util.find_spec(n) is None]
        return f"{', '.join(absent)} not installed (the `{extra}` extra)" if absent else None
    return check


def _tools(*names: str) -> Callable[[], str | None]:
    def check() -> str | None:
        absent = [n for n in names if shutil.which(n) is None]
        return (f"{' and '.join(absent)} not on PATH (`make prometheus` installs Debian's "
                "prometheus, which carries promtool; needs root and apt-get)") if absent else None
    return check


def _cpus() -> str | None:
    n = len(os.sched_getaffinity(0))
    return None if n >= 2 else f"{n} CPU in this process's affinity (needs 2)"


FEATURES: dict[str, Callable[[], str | None]] = {
    "netns": _netns,
    "vllm": _modules("vllm", "vllm", "transformers", "tokenizers"),
    "ray": _modules("ray", "ray"),
    "k8s": _modules("k8s", "helm_python", "kubernetes_validate", "jsonschema"),
    "openai": _modules("dev", "openai"),
    "cpus2": _cpus,
    "prometheus": _tools("prometheus", "promtool"),
}


@cache
def missing(feature: str) -> str | None:
    """Why `feature` is not available here (None: it is)."""
    if feature not in FEATURES:
        raise KeyError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
    return FEATURES[feature]()


def required() -> frozenset[str]:
    raw = os.environ.get("PRFAAS_REQUIRE", "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - set(FEATURES))
    if unknown:
        raise pytest.UsageError(f"PRFAAS_REQUIRE: unknown feature(s) {', '.join(unknown)}; "
                                f"known: {', '.join(FEATURES)}")
    return names


def needs(*features: str) -> pytest.MarkDecorator:
    for f in features:
        missing(f)  # an unknown name fails at import, not as a silent skip
    return pytest.mark.needs(*features)


def unmet(features: tuple[str, ...]) -> tuple[str, str, bool] | None:
    """(feature, why, required) of the first missing one of `features`, or None."""
    for f in features:
        why = missing(f)
        if why is not None:
            return f, why, f in required()
    return None


def message(feature: str, why: str, is_required: bool) -> str:
    if is_required:
        return (f"required feature {feature!r} is missing: {why} "
                f"(PRFAAS_REQUIRE={os.environ.get('PRFAAS_REQUIRE', '')})")
    return f"{PREFIX}{feature}] {why}"


def check(*features: str) -> None:
    """In a fixture or a test: skip (fail, when required) unless `features` are all here."""
    gap = unmet(features)
    if gap is not None:
        if gap[2]:
            pytest.fail(message(*gap), pytrace=False)
        pytest.skip(message(*gap))


def import_for(feature: str, module: str) -> Any:
    """`module`, imported at a test module's top, or the whole module skipped (or failed,
    when `feature` is required) when `feature` is missing: decided before the import."""
    gap = unmet((feature,))
    if gap is not None:
        if gap[2]:
            pytest.fail(message(*gap), pytrace=False)
        pytest.skip(message(*gap), allow_module_level=True)
    return importlib.import_module(module)
