"""`prfaas bandwidth`: egress a prefill cluster needs (Eq. 2)."""

from __future__ import annotations

import click

from prfaas.cli.common import console, echo_json
from prfaas.core.units import format_tokens, parse_length
from prfaas.models.catalog import resolve_model
from prfaas.models.roofline import roofline_profile
from prfaas.planner.bandwidth import measured_name, project


@click.command("bandwidth")
@click.option("--model", "model_name", required=True, help="Model (Table 3 or catalog name).")
@click.option("--gpus", type=int, required=True, help="GPUs in the prefill cluster.")
@click.option("--gpus-per-instance", type=int, default=8, show_default=True)
@click.option("--length", "length", default="32K", show_default=True,
              help="Mean prefill length L_avg (tokens; 1K = 1024).")
@click.option("--source", type=click.Choice(["measured", "model"]), default=None,
              help="measured: the paper's Table 3 (default when the model is in it); "
                   "model: geometry + a roofline profile.")
@click.option("--gpu", default="H200", show_default=True, help="GPU kind for --source model.")
@click.option("--json", "as_json", is_flag=True)
def command(model_name: str, gpus: int, gpus_per_instance: int, length: str,
            source: str | None, gpu: str, as_json: bool) -> None:
    """Egress bandwidth B_out = (N / P) * Phi_kv(L_avg)."""
    tokens = parse_length(length, "--length")
    src = source or ("measured" if measured_name(model_name) else "model")
    profile = None
    if src == "model":
        profile = roofline_profile(resolve_model(model_name), gpu, gpus_per_instance)
    proj = project(model_name, gpus, gpus_per_instance, tokens, src, profile)
    if as_json:
        echo_json({"model": model_name, "gpus": gpus, "gpus_per_instance": gpus_per_instance,
                   "length_tokens": tokens, "source": src,
                   "per_instance_gbps": proj.per_instance_gbps, "egress_gbps": proj.egress_gbps})
        return
    egress = proj.egress_gbps
    shown = f"{egress / 1000:.2f} Tbps" if egress >= 1000 else f"{egress:.1f} Gbps"
    console.print(f"{model_name}: {gpus} GPUs / {gpus_per_instance} per instance at "
                  f"L_avg = {format_tokens(tokens)} -> [bold]{shown}[/bold] egress "
                  f"({proj.per_instance_gbps:.2f} Gbps per instance; {proj.source})")
