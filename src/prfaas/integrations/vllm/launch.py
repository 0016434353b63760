"""`python -m prfaas.integrations.vllm.launch ARGS`: vLLM's OpenAI server, with its idle spin set
and (stream_params.py) a streamed completion's prfaas `kv_transfer_params` as its last event.

After every read of its shared-memory queue a vLLM reader (the Worker waiting for the next
step, the EngineCore waiting for the Worker's answer) spins with sched_yield for
`SpinCondition.busy_loop_s` = 1 s before it sleeps on a zmq notification
(vllm/distributed/device_communicators/shm_broadcast.py; vLLM has no setting for it). On a GPU
host that burns a host core; where two instances share a core, it takes half the core from
the other's prefill, and an instance pinned to one core spins on the core its own Worker
computes on (docs/sim-vs-live.md). `PRFAAS_VLLM_IDLE_SPIN_S=S` makes every SpinCondition spin
S seconds instead (not less than MIN_IDLE_SPIN_S: serve/vllm_settings.py says why).

How the setting reaches every process: vLLM's CPU platform starts EngineCore and Worker with
multiprocessing's `spawn`, which imports the parent's main module (this one, as `__mp_main__`)
in the child before it unpickles anything; the import below applies the env var there too,
before any queue exists. A `fork`ed child inherits the patched class. `apply_idle_spin` fails
with a one-line error if vLLM's SpinCondition no longer takes `busy_loop_s`: a topology that
asks for a spin it cannot get is refused, not silently ignored.
"""

from __future__ import annotations

import inspect
import os

from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.server import IDLE_SPIN_ENV
from prfaas.serve.vllm_settings import check_idle_spin


def parse_idle_spin(raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(IDLE_SPIN_ENV, raw, "must be a number of seconds") from None
    check_idle_spin(seconds, IDLE_SPIN_ENV)
    return seconds


def apply_idle_spin(seconds: float, cls: type | None = None) -> None:
    """Make `busy_loop_s` of every SpinCondition built from now on `seconds` (its default;
    vLLM's queues never pass it). `cls`: the class to patch (tests); vLLM's by default."""
    if cls is None:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
        cls = SpinCondition
    init = cls.__init__  # type: ignore[misc]
    params = [p for p in inspect.signature(init).parameters.values()
              if p.default is not inspect.Parameter.empty
              and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    names = [p.name for p in params]
    if "busy_loop_s" not in names or init.__kwdefaults__:
        raise ConfigError("vllm.idle_spin_s", seconds,
                          f"this vLLM's {cls.__name__}.__init__ has no plain busy_loop_s "
                          "default to set (shm_broadcast.py changed)")
    defaults = list(init.__defaults__)
    defaults[names.index("busy_loop_s")] = float(seconds)
    init.__defaults__ = tuple(defaults)


def apply_from_env() -> float | None:
    raw = os.environ.get(IDLE_SPIN_ENV)
    if raw is None or raw == "":
        return None
    seconds = parse_idle_spin(raw)
    apply_idle_spin(seconds)
    return seconds


apply_from_env()  # the server, and every process vLLM spawns from it (module docstring)

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    from prfaas.integrations.vllm import stream_params

    stream_params.install()  # the API server only: a decode's streamed wire-byte count
    main()
