"""Prometheus text exposition (no client library): the histogram and counter/gauge the
router's and the workers' /metrics are written with."""

from __future__ import annotations

import bisect
from collections import defaultdict


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        out += [f"{self.name}_sum {self.total}", f"{self.name}_count {self.count}"]
        return out


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


class Counter:
    def __init__(self, name: str, help_text: str, kind: str = "counter") -> None:
        self.name, self.help_text, self.kind = name, help_text, kind
        self.values: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] += amount

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]
        out += [f"{self.name}{_labels(k)} {v}" for k, v in sorted(self.values.items())]
        return out
