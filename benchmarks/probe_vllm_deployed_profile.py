"""sim-vs-live on `topologies/vllm-local.yaml` with the profile taken on the deployment's own
instances instead of a standalone one.

Why: `prfaas sim-vs-live` profiles a standalone vLLM instance (no connector) pinned to core 0,
and the deployed PD-P instance's direct calls ran about 1.0-1.3x slower at the same length
(probe_vllm_idle_gap.py); a fixed per-route overhead from the idle points absorbs that only at
their lengths. Per run: start the topology (free ports) and measure, on its PD-P instance, what
`prfaas profile --engine vllm --url` measures there (T_prefill(l), S_kv(l), decode step vs
batch), the core-sharing factor between its PD-P and PrfaaS instances (both on core 0, as
`core_sharing.measure` does with two standalone instances), and the idle points through its
router (experiments/idle_routes.py); stop it; write that profile to DIR/profile_runK.yaml; then
`prfaas sim-vs-live --topology topologies/vllm-local.yaml --quick --profile
DIR/profile_runK.yaml --out DIR/runK` (a fresh deployment for the loads). Run it under the heavy
lock (~5 min a run).

    PYTHONPATH=src .venv/bin/python benchmarks/probe_vllm_deployed_profile.py --out DIR [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "topologies/vllm-local.yaml"


def deployed_profile(path: Path) -> None:
    from prfaas.engine.profiler import cpu_model
    from prfaas.experiments import idle_routes as idle
    from prfaas.experiments.engine_facts import model_facts
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live import free_ports, served_model
    from prfaas.integrations.vllm import core_sharing
    from prfaas.integrations.vllm.deploy import settings
    from prfaas.integrations.vllm.profile import ServedModel, profile_document, run_profile
    from prfaas.serve.topology import load_topology

    topo = load_topology(TOPOLOGY)
    model = ServedModel.from_settings(settings(topo))
    facts = model_facts(topo)
    with deployed(free_ports(topo)) as dep:
        pdp = dep.topology.by_role("pd-p")[0]
        prfaas = dep.topology.by_role("prfaas")[0]
        doc = profile_document(model, run_profile(pdp.url, model),
                               f"{cpu_model()}, cores {pdp.cores}",
                               f"deployed {pdp.name} at {pdp.url}")
        doc["core_sharing"] = core_sharing.measure(pdp.url, prfaas.url, model, pdp.cores or "")
        lengths = [int(p["length_tokens"]) for p in doc["prefill"]["points"]]
        usable = [n for n in lengths if n < facts.max_context_tokens - idle.OUTPUT_TOKENS - 1]
        doc["idle_ttft"] = {"how": idle.HOW, "points": idle.measure_on(
            dep.url, served_model(dep.url), usable, facts.vocab_size, 3, 11)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, args.runs + 1):
        profile = out / f"profile_run{k}.yaml"
        deployed_profile(profile)
        subprocess.run([sys.executable, "-m", "prfaas", "sim-vs-live", "--topology",
                        str(TOPOLOGY), "--quick", "--profile", str(profile), "--out",
                        str(out / f"run{k}")], check=True)


if __name__ == "__main__":
    main()
