"""A worker's `cores` (the CPUs the launcher pins it to) and which workers share them.

`parse_cores`: "0", "0-1", "0,2" as a set of CPU numbers (None: unpinned). `shared_core_groups`:
the workers whose pinned CPU sets overlap, joined transitively, as groups of two or more names in
topology order; an unpinned worker shares with no one here (it floats over the host, which the
topology does not describe). The simulator treats each group as instances that slow each other
while their work overlaps (sim/sharing.py); the profile measures by how much (vLLM:
integrations/vllm/core_sharing.py).
`pin`: this whole process (every thread, and what it starts later) on a worker's or the
router's cores; `pinned_thread`: the calling thread only, for a block, its CPUs restored afterwards
(sim-vs-live's load generator on the router's cores, off the prefill instances').
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from prfaas.core.errors import ConfigError


def parse_cores(cores: str | None) -> set[int] | None:
    """"0", "0-1", "0,2" as a set of CPU numbers; None (unpinned) as None."""
    if cores is None:
        return None
    cpus: set[int] = set()
    for part in cores.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ConfigError("cores", cores, "expected CPU numbers like 0, 0-1 or 0,2")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin(cores: str | None, what: str = "cores") -> None:
    """Pin this whole process to `cores` (None: leave it): every thread it has now (numpy's
    and torch's pools start at import) and, inherited, every thread and process it starts
    later. A CPU this host lacks: ConfigError."""
    cpus = parse_cores(cores)
    if cpus is None:
        return
    for tid in os.listdir("/proc/self/task"):  # every thread, the calling one included
        _set(int(tid), cpus, cores, what)


def _set(tid: int, cpus: set[int], cores: str | None, what: str) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except ProcessLookupError:  # a thread that ended meanwhile
        pass
    except OSError as exc:
        raise ConfigError(what, cores, f"cannot pin to them: {exc}") from exc


@contextlib.contextmanager
def pinned_thread(cores: str | None, what: str = "cores") -> Iterator[None]:
    """The calling thread on `cores` for the block (None: unchanged), its CPUs restored after.
    Only this thread and what it starts inside the block: other threads keep theirs."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    cpus = parse_cores(cores)
    assert cpus is not None
    _set(0, cpus, cores, what)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def shared_core_groups(workers: Sequence[Any]) -> list[tuple[str, ...]]:
    """Names of the workers (objects with `name` and `cores`) pinned to overlapping CPUs."""
    pinned = [(w.name, cpus) for w in workers if (cpus := parse_cores(w.cores))]
    groups: list[tuple[list[str], set[int]]] = []
    for name, cpus in pinned:
        touching = [g for g in groups if g[1] & cpus]
        merged = ([n for g in touching for n in g[0]] + [name],
                  set().union(cpus, *(g[1] for g in touching)))
        groups = [g for g in groups if not g[1] & cpus] + [merged]
    order = {name: i for i, (name, _) in enumerate(pinned)}
    out = [tuple(sorted(names, key=order.__getitem__)) for names, _ in groups if len(names) > 1]
    return sorted(out, key=lambda g: order[g[0]])
