"""vLLM's idle spin on a pinned instance: one standalone instance (the topology's model and
engine arguments, pinned to core 1) per spin setting, one after the other: its prefill time at
256 / 1K / 2K tokens (median of 3, `prfaas profile`'s measure), its decode step at batch 1 and 4,
and the CPU seconds its processes used in the second after a one-token request (psutil, every
thread). `none` = vLLM's own 1 s spin (its server module, unpatched). Run under the heavy lock
(~2 min a setting):

    PYTHONPATH=src .venv/bin/python benchmarks/probe_vllm_idle_spin.py 0.01 none
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _cpu_s(procs: list[Any]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def measure(spin: float | None, log: Path) -> dict[str, Any]:
    import psutil

    from prfaas.integrations.vllm.deploy import prepare, settings
    from prfaas.integrations.vllm.profile import _post, measure_decode, measure_prefill
    from prfaas.integrations.vllm.reference import reference_spec
    from prfaas.integrations.vllm.served_model import ServedModel
    from prfaas.integrations.vllm.server import VllmInstance
    from prfaas.serve.topology import free_port, load_topology

    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    s = settings(topo)
    prepare(topo)
    model = ServedModel.from_settings(s)
    with VllmInstance(reference_spec(s, free_port(), "1", spin), log) as inst:
        rng = np.random.default_rng(0)
        prefill = measure_prefill(inst.spec.url, model, (256, 1024, 2048), 3, rng)
        decode = measure_decode(inst.spec.url, model, (1, 4), 256, 64, rng, reps=3)
        assert inst.proc is not None
        root = psutil.Process(inst.proc.pid)
        procs = [root, *root.children(recursive=True)]
        after = []
        for i in range(3):
            _post(inst.spec.url, {"model": model.name, "prompt": [5 + i] * 64,
                                  "max_tokens": 1}, 60)
            c0 = _cpu_s(procs)
            time.sleep(1.0)
            after.append(round(_cpu_s(procs) - c0, 3))
    return {"idle_spin_s": spin, "prefill_s": prefill, "decode_step_s": decode,
            "cpu_s_in_1s_after_a_step": after, "loadavg_1m_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spins", nargs="+", help="seconds, or none for vLLM's own")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results"
                                             / "vllm_idle_spin_standalone.json"))
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="prfaas-idle-spin-"))
    runs = []
    for raw in args.spins:
        spin = None if raw == "none" else float(raw)
        runs.append(measure(spin, logs / f"vllm-{raw}.log"))
        print(json.dumps(runs[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"topology": "vllm-local", "cores": "1",
                                          "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
