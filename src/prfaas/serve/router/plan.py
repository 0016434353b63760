"""The planner inputs of the live router: a measured engine profile plus the topology.

A topology names a profile (`profile: NAME|PATH`, or `policy: {profile: ...}`; default
`cpu-tiny`, the embedded `data/profiles/cpu-tiny.yaml` measured with `prfaas profile`). A NAME
is looked up in the embedded `data/profiles/`; a PATH (anything with a `/` or ending `.yaml`)
is read as is (the topology loader has already made it absolute). `live_plan_inputs` turns it
into the `PlanInputs` a controlled router (`policy/controlled.py`) needs: prefill time and
S_kv(l) from the profile for both prefill pools (the workers run the same engine), instance
counts from the topology's workers, the inter-DC link rate from `link.rate_gbps`, S_kv(l) on
the wire (its `wire_dtype`, then its codec's measured ratio, `live_codec`). The length
distribution is a placeholder: the controller replaces it with its live window of uncached
lengths before every solve, and the link rate with the LiveView's capacity.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from prfaas.core.errors import ConfigError
from prfaas.models.compression import known_speeds, planned_codec
from prfaas.models.profile import HardwareProfile
from prfaas.models.profile_file import load_profile_file
from prfaas.planner.search import PlanInputs
from prfaas.serve.engines import EngineBackend, engine_backend
from prfaas.serve.router.cluster import UNSHAPED_GBPS
from prfaas.serve.topology import Topology
from prfaas.workload.lengths import empirical

PLACEHOLDER_OUTPUT_TOKENS = 16  # Eq. 7 (the controller's solve) does not use output length


def is_profile_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml"))


def embedded_profiles() -> list[str]:
    folder = resources.files("prfaas.data").joinpath("profiles")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def profile_path(ref: str) -> Path:
    """The file a topology's `profile` names (an embedded name or a path)."""
    if is_profile_path(ref):
        path = Path(ref)
    else:
        path = Path(str(resources.files("prfaas.data").joinpath("profiles", f"{ref}.yaml")))
        if not path.is_file():
            raise ConfigError("profile", ref, f"no embedded profile; known: {embedded_profiles()}")
    if not path.is_file():
        raise ConfigError("profile", ref, "no such file")
    return path


def load_live_profile(ref: str) -> HardwareProfile:
    return load_profile_file(profile_path(ref))


def live_codec(topology: Topology, engine: EngineBackend) -> tuple[str, float]:
    """The inter-DC link's codec and the tensor / wire ratio to predict with before the
    workers report theirs: the rule and the figures the scenario plans with
    (models/compression.py), on the engine's measured KV in the dtype the link sends."""
    link = topology.link
    speeds = known_speeds(engine.codec_kv(), link.wire_dtype or engine.cache_dtype())
    return planned_codec(link.compression, link.rate_gbps, link.connections, speeds)


def live_plan_inputs(topology: Topology, profile: HardwareProfile | None = None) -> PlanInputs:
    """PlanInputs for the topology: `profile` (default: the one the topology names) for both
    prefill pools and decode; n_prfaas = PrfaaS workers, n_pd = PD-P + PD-D workers."""
    engine = engine_backend(topology)
    if profile is None:
        known = engine.plan_inputs()  # e.g. the emulated hardware's
        if known is not None:
            return known
    hw = profile or load_live_profile(topology.profile)
    codec, ratio = live_codec(topology, engine)
    n_prfaas = len(topology.by_role("prfaas"))
    n_pd = len(topology.by_role("pd-p")) + len(topology.by_role("pd-d"))
    top = int(topology.model.get("max_context_tokens", 16384))
    return PlanInputs(
        lengths=empirical([1, top], "placeholder: replaced by the controller's window"),
        # the profile's KV is the engine's cache (fp32 native, bf16 vLLM); the link moves its
        # wire dtype, compressed by the measured ratio of its codec
        output_tokens=PLACEHOLDER_OUTPUT_TOKENS,
        kv=hw.kv.on_wire(topology.link.wire_dtype, engine.cache_dtype()).compressed(ratio,
                                                                                    codec),
        prfaas_prefill=hw.require_prefill(), pd_prefill=hw.require_prefill(),
        decode=hw.require_decode(), n_prfaas=n_prfaas, n_pd=n_pd,
        link_gbps=topology.link.rate_gbps or UNSHAPED_GBPS,
        intra_gbps=topology.intra_link.rate_gbps or UNSHAPED_GBPS,
    )
