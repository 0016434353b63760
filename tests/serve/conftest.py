"""Fixtures shared by the serving tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One deployment (serve_helpers.topology) shared by the live test modules; its router
    keeps a per-request log (`live.request_log`, router/request_log.py)."""
    from serve_helpers import topology

    from prfaas.serve.deploy.launcher import Deployment
    from prfaas.serve.deploy.proc import REQUEST_LOG_ENV

    log = tmp_path_factory.mktemp("router") / "requests.jsonl"
    with Deployment(topology(), router_env={REQUEST_LOG_ENV: str(log)}) as dep:
        dep.request_log = log  # type: ignore[attr-defined]
        yield dep


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    from prfaas.engine import Engine, EngineConfig

    yield Engine(EngineConfig.tiny(threads=1))
