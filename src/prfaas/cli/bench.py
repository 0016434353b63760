"""`prfaas bench`: replay a trace (or synthetic requests) against a running router."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from prfaas.bench.loadgen import Result, run_load
from prfaas.bench.report import render, summarize
from prfaas.bench.workload import Scaling, poisson_arrivals, read_mooncake, synthetic
from prfaas.cli.common import dumps
from prfaas.core.errors import ConfigError


def _model(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
            name: str = json.load(resp)["data"][0]["id"]
            return name
    except OSError as exc:
        raise ConfigError("url", url, f"no router answering: {exc}") from exc
    except ValueError as exc:  # not a URL, or an answer that is not JSON
        raise ConfigError("url", url, f"not a prfaas router URL: {exc}") from exc
    except (KeyError, IndexError, TypeError) as exc:
        raise ConfigError("url", url, "answered /v1/models without a model list") from exc


@click.command("bench")
@click.option("--url", required=True, help="Router base URL, e.g. http://127.0.0.1:8000.")
@click.option("--trace", "trace_path", default=None, help="Mooncake JSONL trace to replay.")
@click.option("--synthetic", "use_synthetic", is_flag=True, help="Synthetic lognormal lengths.")
@click.option("--rate", type=float, default=0.5, show_default=True,
              help="Poisson arrival rate, requests/s (trace rows are taken in order).")
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds during which requests are sent.")
@click.option("--length-scale", type=float, default=0.1, show_default=True,
              help="Scale of input/output lengths (and 512-token trace blocks).")
@click.option("--max-output", "max_output_tokens", type=int, default=32, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--out", "out_path", default=None, help="Write the JSON summary here.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON summary.")
def command(url: str, trace_path: str | None, use_synthetic: bool, rate: float,
            duration_s: float, length_scale: float, max_output_tokens: int, seed: int,
            timeout_s: float, out_path: str | None, as_json: bool) -> None:
    """Replay requests at --rate for --duration; print TTFT/TPOT/throughput and router overhead."""
    if (trace_path is None) == (not use_synthetic):
        raise ConfigError("--trace/--synthetic", trace_path, "give exactly one of them")
    url = url.rstrip("/")
    scaling = Scaling(length_scale, max_output_tokens, seed=seed)
    arrivals = poisson_arrivals(rate, duration_s, seed)
    if trace_path is not None:
        requests = read_mooncake(trace_path, scaling, limit=max(len(arrivals), 1))
    else:
        requests = synthetic(max(len(arrivals), 1), scaling)
    model = _model(url)
    results = _run(url, model, requests, arrivals, timeout_s)
    wall_s = max((r.sent_s + (r.e2e_s or 0.0) for r in results), default=0.0)
    summary = summarize(results, wall_s)
    config: dict[str, Any] = {"url": url, "trace": trace_path, "synthetic": use_synthetic,
                              "rate": rate, "duration_s": duration_s,
                              "length_scale": length_scale, "max_output_tokens": max_output_tokens,
                              "seed": seed, "model": model,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    payload = {"config": config, "summary": summary,
               "requests": [r.to_json() for r in results]}
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(dumps(payload))
    click.echo(dumps({"config": config, "summary": summary}) if as_json else render(summary))


def _run(url: str, model: str, requests: list[Any], arrivals: list[float],
         timeout_s: float) -> list[Result]:
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("requests", total=len(arrivals))
        return asyncio.run(run_load(url, model, requests, arrivals, timeout_s,
                                    on_done=lambda _: progress.advance(task)))
