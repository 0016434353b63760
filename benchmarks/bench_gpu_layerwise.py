"""Layer-wise KV off a GPU, measured on the native engine: one script for a GPU machine.

    python benchmarks/bench_gpu_layerwise.py --out DIR [--quick] [--device cpu|cuda]
                                             [--preset NAME] [--skip-live]

Writes DIR/gpu_layerwise.json (and DIR/profile.yaml, the profile the simulator reads):
- `layerwise`: per prompt length, the engine's prefill (1) with no transfer (`none`: no hook),
  (2) with each layer's tensors copied to the host by `.cpu()` on the model thread (`naive`:
  the negative control, what a connector calling `.cpu()` in `save_kv_layer` does) and (3)
  through the LayerShipper with a sender thread waiting on its tickets (`shipper`). Per mode
  `prefill_s` (median of the repetitions; the modes interleaved in each one; the end is the
  compute stream idle after `prefill` returns) and `vs_none` (its ratio to `none`); for the
  shipper `lag_s` (from that end to the last tensor on the host; negative: it was there
  before the compute ended) and `bytes_equal` (every shipped tensor bytewise equal to a
  direct copy of the prefill's KV taken after it, and every layer shipped).
- `profile`: `prfaas profile`'s document for the preset on this device (T(l), S_kv(l), decode
  steps).
- `live`: a native deployment on this machine (a PrfaaS prefill worker, a PD-P and a decoder,
  all on this device, the inter-DC link shaped to `rate_gbps`), one request at a time of each
  length after one unmeasured round: the client's `ttft_s`; `first_layer_before_prefill_end`
  (the decoder's /status counted received KV bytes while the prefill worker's /status still
  said it was computing: polled decoder first, then prefill, so a True is never a race);
  `sim_ttft_s`, the simulator's TTFT for the same lone request from the profile just measured.
`--device cpu --quick` runs tiny sizes (a schema check in CI, not a GPU figure). On CUDA the
default sizes (8K/32K/128K, profile 1K-128K, live 8K/32K/64K on the `kimi-linear` preset) are
meant to run from source on one H200 in under 8 minutes (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from prfaas.engine.device_ops import DeviceOps, device_ops
from prfaas.engine.engine import Engine
from prfaas.engine.kv import LayerKV
from prfaas.engine.presets import PRESETS, engine_config
from prfaas.engine.profiler import cpu_model, profile_document, prompt_tokens, run_profile
from prfaas.engine.shipper import BlockingShipper, LayerShipper, Ticket
from prfaas.models.engine_config import EngineConfig

RESULT_NAME = "gpu_layerwise.json"
MODES = ("none", "naive", "shipper")
OUTPUT_TOKENS = 4


@dataclass(frozen=True)
class Sizes:
    preset: str
    layer_tokens: tuple[int, ...]
    reps: int
    profile_lengths: tuple[int, ...]
    batches: tuple[int, ...]
    context_tokens: int
    decode_steps: int
    live_lengths: tuple[int, ...]
    threshold_tokens: int  # every live length is above it: all go to the PrfaaS worker
    rate_gbps: float
    # None: the KV crosses as float32, what the profile's S_kv counts, so the simulator's
    # transfer times are of the bytes that cross (a bf16 wire would halve them live only)
    wire_dtype: str | None
    ring_mib: int


K = 1024
SIZES = {
    ("cuda", False): Sizes("kimi-linear", (8 * K, 32 * K, 128 * K), 3,
                           tuple(K << i for i in range(8)), (1, 8, 32), 4 * K, 8,
                           (8 * K, 32 * K, 64 * K), 2 * K, 10.0, None, 512),
    ("cuda", True): Sizes("kimi-linear", (8 * K, 32 * K), 2, (K, 4 * K, 16 * K, 32 * K),
                          (1, 8), 2 * K, 4, (8 * K, 32 * K), 2 * K, 10.0, None, 512),
    ("cpu", False): Sizes("tiny", (1 * K, 2 * K, 4 * K), 3, (256, 512, K, 2 * K, 4 * K),
                          (1, 8), 512, 4, (K, 2 * K, 4 * K), 512, 0.5, None, 64),
    ("cpu", True): Sizes("tiny", (128, 256), 1, (64, 128, 256), (1, 4), 128, 2,
                         (192, 320, 448), 64, 0.5, None, 16),
}


def log(msg: str) -> None:
    print(f"[gpu-layerwise {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the engine on the device ----------------------------------------------------------------
def has_devices() -> bool:
    """Whether this checkout's engine config knows `device` (issue 41's native engine on CUDA)."""
    return "device" in {f.name for f in fields(EngineConfig)}


def make_config(preset: str, device: str) -> EngineConfig:
    if device != "cpu" and not has_devices():
        raise SystemExit(f"--device {device}: this checkout's engine runs on the CPU only")
    if preset not in PRESETS:
        raise SystemExit(f"--preset {preset}: unknown; known: {', '.join(sorted(PRESETS))}")
    return engine_config(preset, **({"device": device} if has_devices() else {}))


def compute_sync(device: str) -> Callable[[], None]:
    """Wait for the compute stream only (the shipper's copy stream may still run)."""
    if device == "cpu":
        return lambda: None
    stream = torch.cuda.current_stream(torch.device(device))
    return stream.synchronize


# -- layerwise: none / naive / shipper ------------------------------------------------------
def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class Run:
    prefill_s: float
    lag_s: float | None
    kv: Any
    shipped: list[tuple[int, str, Ticket]]


def run_mode(engine: Engine, ids: list[int], mode: str, paths: dict[str, Any],
             sync: Callable[[], None]) -> Run:
    """One prefill; in `naive` / `shipper` every layer's tensors go to a sender thread that
    waits on each (as the workers' senders do) and notes when the last one is on the host."""
    path = paths.get(mode)
    shipped: list[tuple[int, str, Ticket]] = []
    todo: queue.Queue[Ticket | None] = queue.Queue()
    arrived: list[float] = []

    def sender() -> None:
        while (ticket := todo.get()) is not None:
            ticket.wait()
            arrived.append(time.perf_counter())

    def hook(layer: LayerKV) -> None:  # the model thread
        for name, t in sorted(layer.tensors.items()):
            ticket = path.ship(0, functools.partial(_same, t), t.shape, t.dtype, keep=(t,))
            shipped.append((layer.layer_index, name, ticket))
            todo.put(ticket)

    thread = threading.Thread(target=sender, name="sender", daemon=True)
    thread.start()
    sync()
    t0 = time.perf_counter()
    result = engine.prefill(ids, None, hook if path is not None else None)
    if path is not None:
        path.end_step()
        path.end_request(0)
    sync()
    t_end = time.perf_counter()
    todo.put(None)
    thread.join()
    lag = max(arrived) - t_end if arrived else None
    return Run(t_end - t0, lag, result.kv, shipped)


def bytes_equal(run: Run, num_tokens: int, num_layers: int) -> bool:
    """Every layer shipped, every tensor bytewise a direct copy of the prefill's KV."""
    if sorted({layer for layer, _, _ in run.shipped}) != list(range(num_layers)):
        return False
    for layer, name, ticket in run.shipped:
        direct = run.kv.export_layer(layer, 0, num_tokens).tensors[name].detach().cpu()
        host = ticket.wait()
        if host.dtype != direct.dtype or host.shape != direct.shape or not torch.equal(
                host.contiguous().reshape(-1).view(torch.uint8),
                direct.contiguous().reshape(-1).view(torch.uint8)):
            return False
    return True


def layerwise(engine: Engine, sizes: Sizes, ops: DeviceOps, sync: Callable[[], None],
              on_row: Callable[[dict[str, Any]], object]) -> None:
    paths = {"naive": BlockingShipper(ops),
             "shipper": LayerShipper(ops, ring_bytes=sizes.ring_mib << 20)}
    for n in sizes.layer_tokens:
        ids = prompt_tokens(n, seed=n)
        for mode in MODES:  # warm-up (allocator, kernels, the ring's pages)
            run_mode(engine, ids, mode, paths, sync)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        lags: list[float] = []
        last: Run | None = None
        for _ in range(sizes.reps):
            for mode in MODES:
                run = run_mode(engine, ids, mode, paths, sync)
                times[mode].append(run.prefill_s)
                if mode == "shipper":
                    lags.append(run.lag_s if run.lag_s is not None else float("nan"))
                    last = run
        assert last is not None
        none = statistics.median(times["none"])
        row: dict[str, Any] = {"tokens": n, "none": {"prefill_s": round(none, 6)}}
        for mode in ("naive", "shipper"):
            med = statistics.median(times[mode])
            row[mode] = {"prefill_s": round(med, 6), "vs_none": round(med / none, 4)}
        row["shipper"]["lag_s"] = round(statistics.median(lags), 6)
        row["shipper"]["bytes_equal"] = bytes_equal(last, n, engine.config.num_layers)
        on_row(row)
        log(f"{n} tokens: none {none * 1e3:.1f} ms, naive {row['naive']['vs_none']:.3f}x, "
            f"shipper {row['shipper']['vs_none']:.3f}x (lag {row['shipper']['lag_s'] * 1e3:.2f}"
            f" ms, bytes equal {row['shipper']['bytes_equal']})")
    log(f"shipper: {paths['shipper'].metrics.as_dict()}")


# -- live: a native deployment, one request at a time ------------------------------------------
def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
        out: dict[str, Any] = json.load(resp)
        return out


class Overlap:
    """Polls the decoder's received KV bytes, then the prefill worker's `running`: a sample
    with more bytes than at the start while the prefill still ran (asked after the bytes)
    shows KV at the decoder before the prefill ended."""

    def __init__(self, decoder: str, prefill: str) -> None:
        self.decoder, self.prefill = decoder, prefill
        self.base = int(_status(decoder)["received_bytes"])
        self.seen = False
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="overlap", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                got = int(_status(self.decoder)["received_bytes"]) > self.base
                running = bool(_status(self.prefill)["running"])
            except OSError:
                continue
            self.samples += 1
            if got and running:
                self.seen = True
            time.sleep(0.001)

    def stop(self) -> bool:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.seen


def topology_raw(sizes: Sizes, preset: str, device: str, max_len: int) -> dict[str, Any]:
    model: dict[str, Any] = {"preset": preset.replace("-", "_"), "threads": 1,
                             "max_context_tokens": max_len}
    if device != "cpu":
        model["device"] = device
    link: dict[str, Any] = {"rate_gbps": sizes.rate_gbps, "connections": 4}
    if sizes.wire_dtype is not None:  # a bf16 engine's KV at 2 bytes a value, exactly
        link["wire_dtype"] = sizes.wire_dtype
    gpu = {"gpus": 0} if device != "cpu" else {}  # every worker on the one GPU
    return {
        "name": "gpu-layerwise", "model": model,
        "policy": {"name": "prfaas-threshold", "threshold_tokens": sizes.threshold_tokens},
        "router": {"port": 0}, "link": link,
        "intra_link": {"rate_gbps": None, "connections": 1},
        "timeouts": {"connect_s": 10, "prefill_s": 600, "kv_s": 600, "token_s": 600},
        "cache": {"capacity_mb": 64},
        "workers": [{"name": "prfaas-0", "role": "prfaas", **gpu},
                    {"name": "pdp-0", "role": "pd-p", **gpu},
                    {"name": "pdd-0", "role": "pd-d", "max_batch": 8, **gpu}],
    }


def live(sizes: Sizes, preset: str, device: str, profile: Path, out: Path,
         max_context_tokens: int, num_layers: int, vocab_size: int) -> list[dict[str, Any]]:
    from prfaas.experiments.idle_routes import lone_request
    from prfaas.experiments.runs import deployed
    from prfaas.experiments.sim_vs_live import (
        Options,
        free_ports,
        scenario_dict,
        served_model,
        simulate_side,
    )
    from prfaas.serve.topology import parse_topology
    from prfaas.workload.requests import Workload

    topo = parse_topology(topology_raw(sizes, preset, device, max_context_tokens))
    lengths = [n for n in sizes.live_lengths if n + OUTPUT_TOKENS < max_context_tokens]
    rows: list[dict[str, Any]] = []
    with deployed(free_ports(topo), out / "live-logs") as dep:
        url, urls = dep.url, {w.name: w.url for w in dep.topology.workers}
        model = served_model(url)
        log(f"live: deployment up at {url}")
        rng = np.random.default_rng(7)
        for n in lengths:  # warm-up, unmeasured: first-time costs of each length
            lone_request(url, model, n, OUTPUT_TOKENS, vocab_size, rng, timeout_s=900.0)
        for n in lengths:
            overlap = Overlap(urls["pdd-0"], urls["prfaas-0"])
            res = lone_request(url, model, n, OUTPUT_TOKENS, vocab_size, rng, timeout_s=900.0)
            seen = overlap.stop()
            rows.append({"prompt_tokens": n,
                         "ttft_s": round(res.ttft_s, 6) if res.ok and res.ttft_s else None,
                         "first_layer_before_prefill_end": seen,
                         "route": res.first_route, "ok": res.ok,
                         "prefill_s": res.prfaas.get("prefill_s"),
                         "kv_bytes": res.prfaas.get("kv_bytes"), "polls": overlap.samples})
            log(f"live {n} tokens: {rows[-1]}")
    options = Options(requests=4, load_fractions=(0.25, 0.5), max_tokens=max(lengths))
    scenario = scenario_dict(topo, profile, options, max_context_tokens)
    lone = Workload(np.arange(len(lengths), dtype=np.float64) * 1000.0,
                    np.array(lengths, dtype=np.int64),
                    np.full(len(lengths), OUTPUT_TOKENS, dtype=np.int64), "lone requests")
    side, _ = simulate_side(topo, scenario, lone, num_layers)
    for row, sim in zip(rows, side.ttft_s, strict=True):
        row["sim_ttft_s"] = round(float(sim), 6)
    return rows


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=("cpu", "cuda"))
    ap.add_argument("--preset", default=None, help="engine preset (default: by device)")
    ap.add_argument("--skip-live", action="store_true", help="no deployment (live: [])")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    sizes = SIZES[(args.device, args.quick)]
    if args.preset:
        sizes = replace(sizes, preset=args.preset)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU here")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = make_config(sizes.preset, args.device)
    need = max(*sizes.layer_tokens, *sizes.profile_lengths,
               *(n + OUTPUT_TOKENS + 1 for n in sizes.live_lengths),
               sizes.context_tokens + 2 * sizes.decode_steps + 2)
    if config.max_context_tokens < need:  # (a preset with a shorter context: grown to fit)
        block = config.block_size_tokens
        config = replace(config, max_context_tokens=-(-need // block) * block)
    log(f"engine {sizes.preset} on {args.device} ({config.name}, {config.num_layers} layers)")
    # (no weight digest: that is a worker's manifest identity; 3.7B weights take seconds)
    engine = (Engine(config, digest_weights=False)
              if "digest_weights" in inspect.signature(Engine).parameters else Engine(config))
    ops = device_ops(args.device)
    sync = compute_sync(args.device)
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"cpu ({cpu_model()}, {torch.get_num_threads()} torch threads)")
    doc: dict[str, Any] = {
        "device": device_name, "layerwise": [], "profile": {}, "live": [],
        "meta": {"preset": sizes.preset, "quick": args.quick, "torch": torch.__version__,
                 "python": platform.python_version(), "host_cpus": os.cpu_count(),
                 "ring_mib": sizes.ring_mib, "reps": sizes.reps,
                 "live_link": {"rate_gbps": sizes.rate_gbps, "wire_dtype": sizes.wire_dtype},
                 "complete": False, "wall_s": 0.0}}
    path = args.out / RESULT_NAME

    def save() -> None:  # after every part: a run cut short keeps what it measured
        doc["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
        path.write_text(json.dumps(doc, indent=1) + "\n")

    layerwise(engine, sizes, ops, sync, lambda row: (doc["layerwise"].append(row), save()))
    log("profile")
    prof = run_profile(engine, sizes.profile_lengths, sizes.batches, 1, sizes.context_tokens,
                       sizes.decode_steps)
    doc["profile"] = profile_document(engine, prof)
    profile_path = args.out / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(doc["profile"], sort_keys=False))
    save()
    num_layers, vocab = config.num_layers, config.vocab_size
    del engine
    if args.device == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_live:
        doc["live"] = live(sizes, sizes.preset, args.device, profile_path, args.out,
                           config.max_context_tokens, num_layers, vocab)
    doc["meta"]["complete"] = True
    save()
    log(f"wrote {path} in {doc['meta']['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
