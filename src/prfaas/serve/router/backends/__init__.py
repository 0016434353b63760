"""Worker backends of the router (base.py: the interface; one file per protocol)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prfaas.core.errors import UnknownNameError
from prfaas.serve.router.backends.base import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
)

BackendFactory = Callable[..., WorkerBackend]


def _native(**kwargs: Any) -> WorkerBackend:
    from prfaas.serve.router.backends.native import NativeBackend

    return NativeBackend(**kwargs)


def _vllm(**kwargs: Any) -> WorkerBackend:
    from prfaas.serve.router.backends.vllm import VllmBackend

    return VllmBackend(**kwargs)


BACKENDS: dict[str, BackendFactory] = {"native": _native, "vllm": _vllm}


def make_backend(name: str, **kwargs: Any) -> WorkerBackend:
    """The registered backend `name` (kwargs: `session`, the router's aiohttp session)."""
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, sorted(BACKENDS))
    return BACKENDS[name](**kwargs)


__all__ = ["BACKENDS", "Attempt", "AttemptFailed", "AttemptReport", "TokenEvent",
           "WorkerBackend", "make_backend"]
