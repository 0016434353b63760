"""`prfaas kv`: KVCache size of a model at given lengths."""

from __future__ import annotations

import click
from rich.table import Table

from prfaas.cli.common import console, echo_json
from prfaas.core.errors import ConfigError
from prfaas.core.units import MIB, format_tokens, parse_lengths
from prfaas.models.catalog import resolve_model
from prfaas.models.kv import WIRE_ALIASES, WIRE_DTYPES, geometry
from prfaas.models.spec import DTYPE_BYTES


@click.command("kv")
@click.option("--model", "model_name", help="Catalog model name or alias.")
@click.option("--model-file", type=click.Path(), help="A model spec file (YAML or JSON).")
@click.option("--lengths", default="1K,8K,32K,128K", show_default=True,
              help="Comma-separated token counts (1K = 1024).")
@click.option("--dtype", type=click.Choice(sorted(DTYPE_BYTES)), default=None,
              help="KV dtype (default: the spec's).")
@click.option("--wire-dtype", type=click.Choice([*WIRE_DTYPES, *WIRE_ALIASES]), default=None,
              help="Full-attention KV on the wire (fp8 = fp8_e4m3 with per-block-per-head "
                   "scales, counted); default: the cache dtype. Linear/SWA state keeps its own.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(model_name: str | None, model_file: str | None, lengths: str, dtype: str | None,
            wire_dtype: str | None, as_json: bool) -> None:
    """KV bytes per token, fixed state bytes and S_kv(l) of a model."""
    if (model_name is None) == (model_file is None):
        raise ConfigError("--model/--model-file", None, "give exactly one of them")
    spec = resolve_model(model_name, model_file)
    lens = parse_lengths(lengths, "--lengths")
    cache = geometry(spec, dtype)
    geo = cache.on_wire(wire_dtype)
    sizes = {str(n): round(geo.size_bytes(n)) for n in lens}
    if as_json:
        echo_json({"model": spec.name, "dtype": dtype or spec.dtype,
                   "wire_dtype": geo.wire_dtype or dtype or spec.dtype,
                   "kv_bytes_per_token": geo.kv_bytes_per_token,
                   "cache_kv_bytes_per_token": cache.kv_bytes_per_token,
                   "wire_fraction": geo.kv_bytes_per_token / cache.kv_bytes_per_token
                   if cache.kv_bytes_per_token else 1.0,
                   "state_bytes": geo.state_bytes, "sizes_bytes": sizes})
        return
    on_wire = f", {geo.wire_dtype} on the wire" if geo.wire_dtype else ""
    table = Table(title=f"{spec.name}: KVCache ({dtype or spec.dtype} KV, "
                        f"{spec.state_dtype} state{on_wire})")
    table.add_column("length", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("MiB", justify="right")
    for n in lens:
        table.add_row(format_tokens(n), f"{sizes[str(n)]:,}", f"{sizes[str(n)] / MIB:,.1f}")
    console.print(table)
    console.print(f"full-attention KV per token: {geo.kv_bytes_per_token:,.0f} B "
                  f"({spec.num_full_attention_layers} of {spec.num_layers} layers); "
                  f"fixed state: {geo.state_bytes / MIB:,.2f} MiB")
