"""Worker backends of the router (base.py: the interface; one file per protocol).

Registered by module path and class name, imported when a router first asks for one: the
native protocol is here (native.py), vLLM's lives with the rest of the vLLM integration
(integrations/vllm/router_half.py), so the router imports no engine's implementation.
"""

from __future__ import annotations

import importlib
from typing import Any

from prfaas.core.errors import UnknownNameError
from prfaas.serve.router.backends.base import (
    Attempt,
    AttemptFailed,
    AttemptReport,
    TokenEvent,
    WorkerBackend,
)

BACKENDS: dict[str, tuple[str, str]] = {
    "native": ("prfaas.serve.router.backends.native", "NativeBackend"),
    "vllm": ("prfaas.integrations.vllm.router_half", "VllmBackend"),
}


def make_backend(name: str, **kwargs: Any) -> WorkerBackend:
    """The registered backend `name` (kwargs: `session`, the router's aiohttp session)."""
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, sorted(BACKENDS))
    module_path, class_name = BACKENDS[name]
    backend: WorkerBackend = getattr(importlib.import_module(module_path), class_name)(**kwargs)
    return backend


__all__ = ["BACKENDS", "Attempt", "AttemptFailed", "AttemptReport", "TokenEvent",
           "WorkerBackend", "make_backend"]
