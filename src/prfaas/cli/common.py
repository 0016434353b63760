"""Helpers shared by CLI commands: JSON output and the rich console (core/console.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from prfaas.core.console import console

__all__ = ["console", "dumps", "echo_json"]


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
