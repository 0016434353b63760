"""The rich console every command and report prints to, built on first use: a `--json` run
never imports rich (start-up time)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

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
