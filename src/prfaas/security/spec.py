"""The topology's `security:` section.

    security:
      tls: {dir: certs}      # mutual TLS 1.3 on the cross-cluster links; relative to the file
      metrics: open          # or `protected`: /metrics needs the router's API key too

`tls: false` turns TLS off. Without a `tls` key it is on exactly when some PrfaaS worker's
host differs from a PD worker's host (the KV then crosses a real network), with `dir: certs`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.core.errors import ConfigError

METRICS_MODES = ("open", "protected")


@dataclass(frozen=True, slots=True)
class SecuritySpec:
    tls_dir: str | None = None  # absolute path of the certificate folder; None: TLS off
    metrics: str = "open"

    def __post_init__(self) -> None:
        if self.metrics not in METRICS_MODES:
            raise ConfigError("security.metrics", self.metrics,
                              f"unknown; known: {', '.join(METRICS_MODES)}")

    @property
    def tls(self) -> bool:
        return self.tls_dir is not None

    def to_dict(self) -> dict[str, Any]:
        return {"tls": {"dir": self.tls_dir} if self.tls_dir else False, "metrics": self.metrics}


def parse_security(raw: object, base: Path | None, prfaas_hosts: Iterable[str],
                   pd_hosts: Iterable[str]) -> SecuritySpec:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("security", raw, "must be a mapping")
    unknown = sorted(set(raw) - {"tls", "metrics"})
    if unknown:
        raise ConfigError("security", unknown[0], "unknown key; allowed: metrics, tls")
    metrics = str(raw.get("metrics", "open"))
    if "tls" not in raw:
        remote = bool(set(prfaas_hosts) - set(pd_hosts))
        return SecuritySpec(_folder("certs", base) if remote else None, metrics)
    tls = raw["tls"]
    if tls is False or tls is None:
        return SecuritySpec(None, metrics)
    if not isinstance(tls, dict) or set(tls) != {"dir"} or not isinstance(tls["dir"], str):
        raise ConfigError("security.tls", tls, "must be false or {dir: FOLDER}")
    return SecuritySpec(_folder(tls["dir"], base), metrics)


def _folder(ref: str, base: Path | None) -> str:
    p = Path(ref)
    return str(p if p.is_absolute() else ((base or Path.cwd()) / p).resolve())
