"""The topology's resilience settings, one validated dataclass per key.

- `health:`   active checks of every worker by the router (serve/router/membership.py);
- `restart:`  the launcher's supervision of worker processes (serve/deploy/supervisor.py);
- `kv_deadline:` how long the KV of one request may take after its prefill computed:
  max(floor_s, multiplier x predicted transfer time), predicted = KV bytes / link rate;
- `admission:` bounded queues in the router: at most `max_inflight` requests in flight and
  `max_queued_per_prefill` waiting per prefill worker; beyond that, 429 with Retry-After.
Unknown keys and bad values raise ConfigError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from prfaas.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class HealthSpec:
    interval_s: float = 0.5  # between two rounds of checks
    timeout_s: float = 2.0  # one GET /health (generous: a loaded host answers late)
    failures_before_down: int = 3
    successes_before_up: int = 2
    retry_after_s: int = 2  # the Retry-After of a 503 (no path can serve)
    path_wait_s: float = 60.0  # how long a failed request waits for a path to come back

    def __post_init__(self) -> None:
        _positive("health", self, ("interval_s", "timeout_s", "path_wait_s"))
        _at_least_one("health", self, ("failures_before_down", "successes_before_up",
                                       "retry_after_s"))


@dataclass(frozen=True, slots=True)
class RestartSpec:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0  # the cap the backoff doubles up to
    reset_after_s: float = 30.0  # up this long: the next exit starts from initial_backoff_s

    def __post_init__(self) -> None:
        _positive("restart", self, ("initial_backoff_s", "max_backoff_s", "reset_after_s"))
        if self.max_backoff_s < self.initial_backoff_s:
            raise ConfigError("restart.max_backoff_s", self.max_backoff_s,
                              f"must be >= initial_backoff_s ({self.initial_backoff_s})")


@dataclass(frozen=True, slots=True)
class DeadlineSpec:
    floor_s: float = 2.0
    multiplier: float = 4.0

    def __post_init__(self) -> None:
        _positive("kv_deadline", self, ("floor_s",))
        if self.multiplier < 1:
            raise ConfigError("kv_deadline.multiplier", self.multiplier, "must be >= 1")

    def deadline_s(self, predicted_s: float) -> float:
        return max(self.floor_s, self.multiplier * predicted_s)


@dataclass(frozen=True, slots=True)
class AdmissionSpec:
    max_inflight: int = 256  # requests the router runs at once (all routes)
    max_queued_per_prefill: int = 32  # requests waiting at one prefill worker
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        _at_least_one("admission", self, ("max_inflight", "max_queued_per_prefill",
                                          "retry_after_s"))


def _positive(where: str, spec: object, names: tuple[str, ...]) -> None:
    for name in names:
        if not getattr(spec, name) > 0:
            raise ConfigError(f"{where}.{name}", getattr(spec, name), "must be > 0")


def _at_least_one(where: str, spec: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(spec, name) < 1:
            raise ConfigError(f"{where}.{name}", getattr(spec, name), "must be >= 1")


S = TypeVar("S", HealthSpec, RestartSpec, DeadlineSpec, AdmissionSpec)


def parse_spec(cls: type[S], raw: object, where: str) -> S:
    """`cls` from a topology mapping (None: the defaults)."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "must be a mapping")
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(where, key, f"unknown key; allowed: {', '.join(sorted(known))}")
        kind = int if known[key].type in ("int", int) else float
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}.{key}", value, "must be a number")
        if kind is int and value != int(value):
            raise ConfigError(f"{where}.{key}", value, "must be a whole number")
        values[key] = kind(value)
    return cls(**values)


def to_dict(spec: object) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}  # type: ignore[arg-type]
