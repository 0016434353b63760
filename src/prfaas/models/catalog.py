"""The built-in model catalog (data/models.json, copied from the project's shared data with
its attribution in data/README.md) and lookup by name or alias, case-insensitive."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

from prfaas.core.errors import UnknownNameError
from prfaas.models.spec import ModelSpec, load_spec_file, parse_spec


@cache
def catalog() -> dict[str, ModelSpec]:
    text = resources.files("prfaas.data").joinpath("models.json").read_text()
    specs = [parse_spec(raw, where=f"models.json[{i}]") for i, raw in enumerate(json.loads(text))]
    return {s.name: s for s in specs}


def find_model(name: str) -> ModelSpec:
    """A catalog model by name or alias (case-insensitive)."""
    wanted = name.strip().lower()
    for spec in catalog().values():
        if wanted == spec.name.lower() or wanted in (a.lower() for a in spec.aliases):
            return spec
    raise UnknownNameError("model", name, list(catalog()))


def resolve_model(name: str | None = None, path: str | Path | None = None) -> ModelSpec:
    """A model from the catalog (by name) or from a spec file (by path); exactly one is given.

    A `name` that is an existing file path is loaded as a spec file, so scenarios can say
    either `model: Kimi-Linear-48B-A3B` or `model: my-model.yaml`.
    """
    if path is not None:
        return load_spec_file(path)
    assert name is not None
    if name.endswith((".yaml", ".yml", ".json")) and Path(name).is_file():
        return load_spec_file(name)
    return find_model(name)
