"""The project's exceptions.

Bad user input raises a `PrfaasError` subclass whose message names the offending field and
value; the CLI prints that one line and exits 2. Network and OS errors are translated into
`TransportError` at the transport boundary.
"""

from __future__ import annotations


class PrfaasError(Exception):
    """Base of every error prfaas raises on purpose."""


class ConfigError(PrfaasError, ValueError):
    """A config, spec, scenario or CLI value is invalid."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 160:  # a whole file or list pasted into a one-line error helps nobody
            shown = shown[:150] + "...(" + str(len(shown)) + " chars)"
        super().__init__(f"{field}={shown}: {reason}")


class UnknownNameError(ConfigError):
    """A name (model, system, policy, arrival process...) is not in its registry."""

    def __init__(self, field: str, value: object, known: list[str]) -> None:
        shown = ", ".join(sorted(known)[:30])
        super().__init__(field, value, f"unknown; known: {shown}")


class InfeasibleError(PrfaasError):
    """A scenario admits no feasible configuration (zero instances, zero bandwidth...)."""


class TraceError(PrfaasError):
    """A trace file is missing or malformed; names the file and line."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")


class TransportError(PrfaasError):
    """A KV transfer failed (bad frame, checksum, timeout, peer gone)."""
