"""Reading user files at the boundary: every failure becomes a ConfigError naming the file."""

from __future__ import annotations

from pathlib import Path

from prfaas.core.errors import ConfigError


def read_text(path: str | Path, field: str) -> str:
    """The file's text (UTF-8); missing, unreadable or binary files raise ConfigError."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except IsADirectoryError:
        raise ConfigError(field, str(path), "is a folder, not a file") from None
    except UnicodeDecodeError:
        raise ConfigError(field, str(path), "not a text file (not valid UTF-8)") from None
    except OSError as err:
        raise ConfigError(field, str(path), f"cannot read it ({err.strerror})") from None
