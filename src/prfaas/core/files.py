"""Reading user files at the boundary: every failure becomes a ConfigError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

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


def read_structured(path: str | Path, field: str) -> Any:
    """A YAML file (JSON when the name ends in .json) parsed; every failure is a ConfigError
    naming `field` and the file."""
    text = read_text(path, field)
    try:
        return json.loads(text) if Path(path).suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(field, str(path), f"not valid YAML/JSON ({err})") from None
