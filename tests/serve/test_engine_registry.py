"""The engine registry (serve/engines.py): a topology's `engine:` picks a backend by name, a new
backend plugs in by module path alone, and the router process built from it imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import topology

from prfaas.core.errors import ConfigError
from prfaas.models.card import ModelCard
from prfaas.serve import engines
from prfaas.serve.engines import EngineBackend, backend_class, engine_backend, register_engine
from prfaas.serve.router.service import RouterService

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_registered_engines_and_an_unknown_one() -> None:
    assert engines.engine_names() == ("emulated", "native", "vllm")
    assert backend_class("vllm").health_has_body is False
    assert backend_class("native").health_has_body is True
    with pytest.raises(ConfigError, match="sglang"):
        topology(workers=[{"name": "p", "role": "pd-p", "engine": "sglang"},
                          {"name": "d", "role": "pd-d", "engine": "sglang"}])


class FakeBackend(EngineBackend):
    """A backend defined outside the package's code paths (this test module)."""

    name = "fake-for-test"
    worker_protocol = "native"

    def card(self) -> ModelCard:
        from prfaas.models.kv import KVGeometry

        return ModelCard("fake-model", 4096, 32, KVGeometry("fake-model", 100, 0, 0, 0, 0))

    def worker_engine(self, name: str) -> Any:
        raise AssertionError("not used here")


def test_a_new_backend_plugs_in_by_module_path_alone() -> None:
    """Registered by module path, the router serves its card: nothing else names it."""
    register_engine(FakeBackend.name, __name__, "FakeBackend")
    try:
        topo = topology(workers=[{"name": "p", "role": "pd-p", "engine": FakeBackend.name},
                                 {"name": "d", "role": "pd-d", "engine": FakeBackend.name}])
        assert type(engine_backend(topo)).__name__ == "FakeBackend"
        service = RouterService(topo)
        assert (service.config.name, service.config.block_size_tokens) == ("fake-model", 32)
        assert service.cluster.geometry.kv_bytes_per_token == 100
        with pytest.raises(ConfigError, match="already registered"):
            register_engine(FakeBackend.name, __name__, "FakeBackend")
    finally:
        engines._REGISTRY.pop(FakeBackend.name)
    assert FakeBackend.name not in engines.engine_names()


PROBE = textwrap.dedent("""
    import json, sys
    from prfaas.serve.deploy.proc import build_app
    build_app(sys.argv[1], sys.argv[2])
    print(json.dumps({"torch": "torch" in sys.modules,
                      "engine": any(m.startswith("prfaas.engine") for m in sys.modules)}))
""")


def _modules_after_build(tmp_path: Path, name: str) -> dict[str, bool]:
    path = tmp_path / "topology.yaml"
    topology().dump(path)
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), name], check=True,
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    result: dict[str, bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_router_process_imports_no_torch(tmp_path: Path) -> None:
    """The router's app is built as proc.py builds it, in a fresh interpreter: no torch, no
    prfaas.engine. Control: the same probe on a worker of the same topology sees both, so the
    probe can tell."""
    assert _modules_after_build(tmp_path, "router") == {"torch": False, "engine": False}
    assert _modules_after_build(tmp_path, "pdd-0") == {"torch": True, "engine": True}
