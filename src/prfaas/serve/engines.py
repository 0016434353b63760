"""Engine backends: what a topology's `engine:` value plugs in, and the registry of them.

A backend is everything the three programs need to know of one kind of engine, so nothing else
asks which kind it has:
- the router: the model's card (models/card.py: name, context, block size, KV geometry), its
  tokenizer, the router-side protocol it drives the workers with (router/backends/), the prior
  prefill cost models and planner inputs (if the backend knows better than the measured
  profile), whether a worker's /health carries a JSON body;
- a worker: the engine it computes with (engine/base.py's interface), or, for a backend whose
  workers are another program (vLLM), the process replaced by that program;
- the deployment: what to prepare before the instances start, how long they may take.

Backends register by module path and class name and are imported only when a topology names
them (vLLM's KVConnectorFactory does the same), so the router of a native deployment never
imports torch, and a new backend is one file plus one `register_engine` line.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.models.card import ModelCard
from prfaas.models.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from prfaas.cache.block_events import EventStats
    from prfaas.cache.listener import PoolListener
    from prfaas.engine.base import EngineBase
    from prfaas.models.profile import PrefillTime
    from prfaas.planner.search import PlanInputs
    from prfaas.serve.topology import Topology

DEFAULT_ENGINE = "native"


# The deployment's private folder, named to each process the launcher spawns (launch_topology).
RUN_DIR_ENV = "PRFAAS_RUN_DIR"

class CacheEventSource(Protocol):
    """The instances' cache events, feeding the router's manager from the router's loop."""

    @property
    def stats(self) -> dict[str, EventStats]: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def forget(self, name: str) -> None: ...


class EngineBackend(ABC):
    """One kind of engine, bound to a topology. Subclasses set `name` and implement `card`
    and `worker_engine`; the rest has defaults that fit prfaas' own workers."""

    name: ClassVar[str]
    worker_protocol: ClassVar[str] = "native"  # the router's WorkerBackend (router/backends/)
    health_has_body: ClassVar[bool] = True  # /health answers {ok, pid}; vLLM's: 200, empty
    start_timeout_s: ClassVar[float] = 0.0  # the launcher waits at least this long per start
    # lossy link wire dtypes its workers encode and decode (topology `link.wire_dtype`); none:
    # its KV crosses as cached (the emulated engine checks its KV bytes exactly)
    wire_dtypes: ClassVar[tuple[str, ...]] = ()
    # how its prefill workers put concurrent transfers to one decoder on the link, as the
    # simulator orders them (sim/link.py): "shared", interleaved on the connections (prfaas'
    # worker: one sending task per transfer), or "fifo", one after another
    link_order: ClassVar[str] = "shared"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    @classmethod
    def check(cls, topology: Topology) -> None:
        """Reject a topology this backend cannot run (called when the topology is built)."""
        return None

    @abstractmethod
    def card(self) -> ModelCard:
        """What the router knows of the model (no torch)."""

    def tokenizer(self) -> Any:
        """The router's tokenizer (encode(text) -> ids, decode(ids) -> text, eos_id)."""
        return ByteTokenizer()

    def tokenizer_folder(self, out_dir: Path) -> Path:
        """Write the served model's tokenizer as a Hugging Face folder (tokenizer.json,
        tokenizer_config.json) that benchmark clients load to count as the router does;
        returns the folder. prfaas' engine: its byte tokenizer (models/hf_tokenizer.py)."""
        from prfaas.models.hf_tokenizer import write_byte_tokenizer

        card = self.card()
        return write_byte_tokenizer(out_dir, card.name, card.max_context_tokens)

    def prefill_models(self) -> dict[str, PrefillTime]:
        """Known prefill cost models by worker name (the router's prior); none: it learns a
        seconds-per-token rate from the workers' reports (router/cluster.py)."""
        return {}

    def cache_dtype(self) -> str:
        """The dtype its workers cache full-attention KV in: a fitted profile's KV slope is
        taken as it when the link has a wire dtype (router/plan.py). prfaas' engine: fp32."""
        return "fp32"

    def codec_kv(self) -> str | None:
        """Whose measured codec figures (data/codec_speeds.json) predict its KV's compression
        on a `link.compression` link before the workers report; None: none measured (the
        router predicts uncompressed bytes until they do). prfaas' engine: native_tiny."""
        return "native_tiny"

    def kv_release(self) -> dict[str, Any] | None:
        """When its prefill workers hand a request's KV to the link, as the simulator's
        `link.release` (models/kv_release.py); None: each layer as its forward finishes, the
        simulator's default (prfaas' worker streams layer by layer)."""
        return None

    def plan_inputs(self) -> PlanInputs | None:
        """A controlled router's planner inputs; None: from the topology's measured profile
        (router/plan.py)."""
        return None

    def worker_protocol_args(self) -> dict[str, Any]:
        """Keyword arguments of the router's WorkerBackend besides its session."""
        return {}

    def cache_events(self, listener: PoolListener) -> CacheEventSource | None:
        """A source of the instances' own cache events that keeps `listener` (the router's
        GlobalKVCacheManager) current; None: the router infers the cache state from the
        cache deltas its worker backend reports."""
        return None

    def prepare(self) -> None:
        """Before any instance starts (the deployment): e.g. build a model on disk."""
        return None

    def launch_topology(self, local_workers: frozenset[str], run_dir: Path) -> Topology:
        """The topology a deployment launches (serve/deploy/launcher.py), given the workers it
        starts on this host and a private folder (0700) it removes on stop: what only the
        launch knows (vLLM: where KV events are published beside TLS). Default: as it is.
        The launcher also names that folder to every process it spawns (RUN_DIR_ENV), for
        scratch files that must not outlive the deployment (vLLM: its ZMQ IPC sockets)."""
        return self.topology

    @abstractmethod
    def worker_engine(self, name: str) -> EngineBase:
        """The engine worker `name` computes with, in this process. A backend whose workers
        are another program replaces the process with it here and does not return."""


_REGISTRY: dict[str, tuple[str, str]] = {}


def register_engine(name: str, module_path: str, class_name: str) -> None:
    """Make `engine: name` load `module_path`'s `class_name` (an EngineBackend) when used."""
    if name in _REGISTRY:
        raise ConfigError("engine", name, "already registered")
    _REGISTRY[name] = (module_path, class_name)


def engine_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def backend_class(name: str) -> type[EngineBackend]:
    if name not in _REGISTRY:
        raise UnknownNameError("engine", name, list(_REGISTRY))
    module_path, class_name = _REGISTRY[name]
    cls = getattr(importlib.import_module(module_path), class_name)
    assert issubclass(cls, EngineBackend) and cls.name == name, (name, cls)
    return cls


def engine_backend(topology: Topology) -> EngineBackend:
    """The backend of the engine the topology's workers run."""
    return backend_class(topology.engine)(topology)


register_engine("native", "prfaas.serve.native", "NativeEngineBackend")
register_engine("emulated", "prfaas.emulated.backend", "EmulatedEngineBackend")
register_engine("vllm", "prfaas.integrations.vllm.engine_backend", "VllmEngineBackend")
