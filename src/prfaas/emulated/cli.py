"""Command-line helpers of the emulated backend: parsing `--scales` and the topology
`prfaas serve --scenario` runs."""

from __future__ import annotations

from prfaas.core.errors import ConfigError
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import emulated_system
from prfaas.serve.topology import Topology

_INTS = ("tokens", "output")


def parse_scales(text: str | None) -> Scales:
    """`time=0.25,bytes=2e-3,tokens=8,output=64` (any subset; the rest default)."""
    if not text:
        return Scales()
    raw: dict[str, float | int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError("--scales", part, "expected key=value")
        try:
            raw[key] = int(value) if key in _INTS else float(value)
        except ValueError:
            raise ConfigError(f"--scales {key}", value, "not a number") from None
    return Scales.from_json(raw)


def scenario_topology(scenario: str, system: str, scales_text: str | None,
                      topology_path: str | None) -> Topology:
    if topology_path is not None:
        raise ConfigError("--topology", topology_path, "give either --topology or --scenario")
    return emulated_system(scenario, system, parse_scales(scales_text)).topology
