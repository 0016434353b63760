"""Fixtures shared by the serving tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def live() -> Iterator[Any]:
    """One deployment (serve_helpers.topology) shared by the live test modules."""
    from serve_helpers import topology

    from prfaas.serve.deploy.launcher import Deployment

    with Deployment(topology()) as dep:
        yield dep


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    from prfaas.engine import Engine, EngineConfig

    yield Engine(EngineConfig.tiny(threads=1))
