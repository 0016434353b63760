"""`prfaas tokenizer --out DIR`: the served model's tokenizer as a Hugging Face folder.

Benchmark clients (guidellm, aiperf, `vllm bench serve`) load it with `--tokenizer DIR` and
then count prompt tokens exactly as the router does (docs/clients.md). Native and emulated
engines: prfaas' byte tokenizer (models/hf_tokenizer.py); vLLM: the served model's own files.
"""

from __future__ import annotations

from pathlib import Path

import click

from prfaas.models.hf_tokenizer import install_in_hf_cache
from prfaas.serve.engines import engine_backend
from prfaas.serve.topology import load_topology


@click.command("tokenizer")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="Folder to write tokenizer.json and tokenizer_config.json to.")
@click.option("--topology", "topology_path", default=None, metavar="PATH",
              help="Topology YAML (default: the embedded topologies/local.yaml).")
@click.option("--hf-cache", "hf_cache", default=None, metavar="DIR",
              help="Also lay the folder out in this Hugging Face hub cache as repo "
              "prfaas/<model>, for clients that look tokenizers up by repo id offline "
              "(aiperf's trace replay: docs/clients.md).")
def command(out_dir: str, topology_path: str | None, hf_cache: str | None) -> None:
    """Write the tokenizer of the model a topology serves, for benchmark clients."""
    topo = load_topology(topology_path)
    backend = engine_backend(topo)
    folder = backend.tokenizer_folder(Path(out_dir))
    name = backend.card().name
    click.echo(f"wrote {folder}: the tokenizer of '{name}' ({topo.engine} engine)")
    click.echo(f"clients: --model {name} --tokenizer {folder.absolute()}")
    if hf_cache is not None:
        repo = f"prfaas/{name}"
        install_in_hf_cache(folder, hf_cache, repo)
        click.echo(f"hub cache: HF_HUB_CACHE={Path(hf_cache).absolute()} HF_HUB_OFFLINE=1 ... "
                   f"--tokenizer {repo}")
