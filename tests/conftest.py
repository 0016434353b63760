"""How `make unit` splits the suite over two pytest-xdist workers (`-n 2`).

`make unit` runs everything but the vLLM tests on two workers, then the vLLM tests alone in one
process: each live vLLM module starts two or three instances (~3 GB, 35-200 s each on a loaded
2-core host) pinned to cores, and beside another worker's tests their fixtures ran past the
300 s timeout (tried). A worker takes whole groups, so fixtures scoped to a module or a session
start once per group, not once per test. Groups (`group_of`):
- `vllm`: every vLLM test on one worker (should they be run with -n).
- `ray`: the Ray modules, one cluster at a time (each cluster is a GCS, raylets and ~0.8 GiB).
- otherwise the top directory (`tests/serve`, `tests/sim`, ...): a directory's modules share
  session fixtures (tests/serve's live deployment, tests/deploy's engine), and its netns probes
  use fixed indexes.
The grouping is a scheduler of our own (the `pytest_xdist_make_scheduler` hook) rather than
`xdist_group` marks: pytest-xdist 3.8 tags a marked test by setting `item._nodeid`, which
pytest 9.2 no longer reads, so `--dist loadgroup` spread one group over both workers (tried).
Without -n the hook is not called and the suite runs in one process.
"""

from __future__ import annotations

from typing import Any

import pytest


def group_of(nodeid: str) -> str:
    """The group of a test by its node id (`tests/serve/test_x.py::test_y[...]`)."""
    parts = nodeid.split("::", 1)[0].split("/")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    if parts[:2] == ["integrations", "vllm"]:
        return "vllm"
    if parts[0] == "deploy" and parts[-1].startswith("test_ray_"):
        return "ray"
    return parts[0] if len(parts) > 1 else "top"


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling with `group_of` as the scope: whole groups per worker."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


# -- skips: only for a missing feature, and never for a required one (tests/needs.py) ----------

def pytest_configure(config: Any) -> None:
    from needs import required

    config.addinivalue_line("markers", "needs(*features): skip unless these features are "
                            "here (tests/needs.py); fail instead when PRFAAS_REQUIRE lists one")
    required()  # an unknown feature name in PRFAAS_REQUIRE is a usage error, at once


def pytest_runtest_setup(item: Any) -> None:
    """Decided from the machine (tests/needs.py), before any fixture or test code runs."""
    from needs import check

    check(*(f for mark in item.iter_markers("needs") for f in mark.args))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """With PRFAAS_REQUIRE set, a skip that did not come from a missing, unrequired feature
    (a bare pytest.skip, an importorskip, a skip decided by what a test measured) fails."""
    from needs import PREFIX, required

    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not required():
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if PREFIX in reason:
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped outside tests/needs.py while PRFAAS_REQUIRE is set (a test may "
                       f"skip only for a missing feature): {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: Any) -> Any:
    """The same for a whole module skipped while it is collected (a module-level importorskip)."""
    from needs import PREFIX, required

    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not required():
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if PREFIX not in reason:
        report.outcome = "failed"
        report.longrepr = (f"module skipped outside tests/needs.py while PRFAAS_REQUIRE is "
                           f"set: {reason}")
