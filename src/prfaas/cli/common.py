"""Helpers shared by CLI commands: JSON output and the rich console.

`console` is built on first use: a `--json` run never imports rich (start-up time).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, cast

import click

if TYPE_CHECKING:
    from rich.console import Console


class _LazyConsole:
    """Stands in for the rich Console, built on first use (attribute reads and writes and the
    context-manager protocol go to it, so it can be handed to rich's Progress)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_console", None)

    def _real(self) -> Console:
        real: Console | None = object.__getattribute__(self, "_console")
        if real is None:
            from rich.console import Console

            # wide enough for the plan table when output is piped (CI logs, README captures)
            real = Console(width=None if Console().is_terminal else 130)
            object.__setattr__(self, "_console", real)
        return real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real(), name, value)

    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._real().__exit__(*exc)


console = cast("Console", _LazyConsole())


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def dumps(payload: Any) -> str:
    """Deterministic JSON: sorted keys, NaN/inf as null."""
    return json.dumps(_clean(payload), indent=2, sort_keys=True)


def echo_json(payload: Any) -> None:
    click.echo(dumps(payload))
