"""Unit helpers. Units live in names: `_s`, `_bytes`, `_gbps`, `_tokens`.

Conventions: 1K tokens = 1024 tokens; 1 MiB = 2**20 bytes; 1 Gbps = 1e9 bit/s (network
rates are decimal, as link vendors quote them).
"""

from __future__ import annotations

import re

from prfaas.core.errors import ConfigError

KIB = 1024
MIB = 1024**2
BITS_PER_BYTE = 8

_LENGTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_length(text: str | int, field: str = "length") -> int:
    """Parse a token count: `1K` = 1024, `128K` = 131072, `1M` = 1048576, or a plain integer."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _LENGTH_RE.match(str(text))
        if not match:
            raise ConfigError(field, text, "expected a token count like 8192, 8K or 1M")
        number, suffix = float(match.group(1)), match.group(2).upper()
        scale = {"": 1, "K": KIB, "M": MIB}[suffix]
        value_f = number * scale
        if value_f != int(value_f):
            raise ConfigError(field, text, "not a whole number of tokens")
        value = int(value_f)
    if value <= 0:
        raise ConfigError(field, text, "must be a positive number of tokens")
    return value


def parse_lengths(text: str, field: str = "lengths") -> list[int]:
    """Parse a comma-separated list of token counts."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ConfigError(field, text, "expected a comma-separated list like 1K,8K,32K")
    return [parse_length(p, field) for p in parts]


def format_tokens(tokens: float) -> str:
    """8192 -> '8K' (binary K for exact multiples of 1024), 19400 -> '19.4K'."""
    if tokens >= KIB and float(tokens) % KIB == 0:
        return f"{int(tokens) // KIB}K"
    if tokens >= 1000:
        return f"{tokens / 1000:.1f}K".replace(".0K", "K")
    return f"{tokens:.0f}"


def gbps_to_bytes_per_s(gbps: float) -> float:
    return gbps * 1e9 / BITS_PER_BYTE


def bytes_per_s_to_gbps(bytes_per_s: float) -> float:
    return bytes_per_s * BITS_PER_BYTE / 1e9
